"""PendingStep: a step the tt backend has submitted; ``result`` waits for its decode ids.

``submit`` leaves at most one device read in flight per step: the greedy ids of the decode
replay (``out_ids``), started right after the replay. Everything else the step needs from the
host (prefill ids, logits, logprobs) was read blocking before ``submit`` returned, so
``result`` only waits on that read's event and fills the greedy rows' tokens.
"""

from __future__ import annotations

import numpy as np

from tt_serve.model.interface import StepOutput
from tt_serve.model.tt.ops import Ops, PendingRead


class PendingStep:
    """A submitted step. ``rows`` lists (row index, ``out_ids`` column) of its greedy decode
    rows."""

    def __init__(
        self,
        out: StepOutput,
        *,
        resident_slots: frozenset[int] = frozenset(),
        ops: Ops | None = None,
        read: PendingRead | None = None,
        rows: tuple[tuple[int, int], ...] = (),
    ) -> None:
        if read is not None and ops is None:
            raise ValueError("a pending read needs the ops that started it")
        self._out = out
        self._resident = resident_slots
        self._ops, self._read, self._rows = ops, read, rows

    @property
    def resident_slots(self) -> frozenset[int]:
        return self._resident

    @property
    def done(self) -> bool:
        return self._read is None

    def result(self) -> StepOutput:
        """Wait for the decode ids (once) and return the step's output."""
        if self._read is None:
            return self._out
        assert self._ops is not None
        ids = self._ops.read_finish(self._read).reshape(-1).astype(np.int64)
        self._read = None
        for i, column in self._rows:
            self._out.token_ids[i] = int(ids[column])
        return self._out
