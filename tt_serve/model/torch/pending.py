"""PendingStep: a step the torch backend has submitted; ``result`` waits for its greedy ids.

Rows of the eager path are finished before ``submit`` returns (``done``). Rows the bucketed
programs ran (``torch/cuda``) leave their ids in a non-blocking device-to-host copy whose event
``result`` waits on, and the logits of the rows that asked for them on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tt_serve.model.interface import StepOutput, StepRow
from tt_serve.model.torch.outputs import fill_logprobs


@dataclass
class PendingStep:
    """A launched step: results are read (blocking on an event) only in ``result``."""

    out: StepOutput
    rows: tuple[StepRow, ...]
    ids_host: torch.Tensor | None = None
    event: torch.cuda.Event | None = None
    positions: dict[int, int] = field(default_factory=dict)  # row index -> index in ids_host
    logits: dict[int, torch.Tensor] = field(default_factory=dict)  # row index -> [1, vocab]
    resident_slots: frozenset[int] = frozenset()
    done: bool = False
    host_bytes: int = 0  # what ``result`` copies to the host (ids, requested logits)

    def result(self) -> StepOutput:
        if self.done:
            return self.out
        if self.event is not None:
            self.event.synchronize()
        ids = self.ids_host.tolist() if self.ids_host is not None else []
        for i, p in self.positions.items():
            row = self.rows[i]
            if row.sample and not row.want_logits:
                self.out.token_ids[i] = int(ids[p])
        for i, lg in self.logits.items():
            if self.rows[i].want_logits:
                self.out.logits[i] = lg[0].cpu().numpy()
            else:
                chosen = torch.tensor([ids[self.positions[i]]], device=lg.device)
                fill_logprobs(self.out, lg, chosen, [i], self.rows)
        self.done = True
        return self.out
