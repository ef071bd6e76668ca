"""The decode and prefill programs of the static-shape path (as ``tt/runtime/model``'s).

Each program reads only its persistent inputs (``buffers.FlatInputs``) and the pools, and ends
with a device argmax, returning (logits, ids); with ``slot_ids`` (deviceResident) it also
scatters the ids into a per-state-slot device tensor, and a decode row marked ``fed`` reads its
input id from there instead of from the host-written buffer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from tt_serve.model.ref.attention import AttentionWeights
from tt_serve.model.ref.gdn import GdnWeights
from tt_serve.model.ref.layers import rope_cos_sin
from tt_serve.model.ref.plan import StepPlan
from tt_serve.model.torch.cuda.buffers import FlatInputs
from tt_serve.model.torch.cuda.masked import PrefillRow, masked_attention, masked_gdn
from tt_serve.model.torch.cuda.programs import Program
from tt_serve.model.torch.model import HybridModel
from tt_serve.model.torch.pools import Pools


def decode_program(
    model: HybridModel, pools: Pools, inputs: FlatInputs, slot_ids: torch.Tensor | None
) -> Program:
    """B single-token rows through the eager decode kernels, on fixed-shape inputs."""
    v = inputs.views
    rows = torch.arange(v["ids"].shape[0], device=inputs.flat.device)

    def run() -> tuple[torch.Tensor, ...]:
        ids = v["ids"]
        if slot_ids is not None:
            ids = torch.where(v["fed"] != 0, slot_ids.index_select(0, v["slots"]), ids)
        plan = StepPlan(
            token_ids=ids,
            positions=v["positions"],
            kv_blocks=v["kv_blocks"],
            kv_offsets=v["kv_offsets"],
            spans=(),
            dec_tokens=rows,
            dec_slots=v["slots"],
            dec_tables=v["tables"],
            dec_lens=v["lens"],
            last_tokens=rows,
        )
        logits = model.logits(model.hidden_states(plan, pools))
        return _finish(logits, v["slots"], pools, slot_ids)

    return run


def prefill_program(
    model: HybridModel,
    pools: Pools,
    inputs: FlatInputs,
    slot_ids: torch.Tensor | None,
) -> Program:
    """One padded prefill row through the masked mixers; logits of its last valid token."""
    v = inputs.views
    key_pos = torch.arange(v["table"].shape[0] * pools.block_size, device=inputs.flat.device)
    row = PrefillRow(**v, key_pos=key_pos)

    def gdn(
        h: torch.Tensor, w: GdnWeights, j: int, keep: Sequence[int] | None = None
    ) -> torch.Tensor:
        assert keep is None  # a static program computes every token of its row
        return masked_gdn(h, w, row, pools.conv[j], pools.rec[j])

    def run() -> tuple[torch.Tensor, ...]:
        x = F.embedding(row.ids, model.embed)
        cos, sin = rope_cos_sin(row.positions, model.inv_freq, x.dtype)

        def attn(
            h: torch.Tensor, w: AttentionWeights, j: int, keep: Sequence[int] | None = None
        ) -> torch.Tensor:
            assert keep is None
            return masked_attention(h, w, row, cos, sin, pools.k[j], pools.v[j])

        hidden = model.run_layers(x, gdn, attn)
        logits = model.logits(hidden.index_select(0, row.last))
        return _finish(logits, row.slot, pools, slot_ids)

    return run


def _finish(
    logits: torch.Tensor, slots: torch.Tensor, pools: Pools, slot_ids: torch.Tensor | None
) -> tuple[torch.Tensor, ...]:
    ids = logits.argmax(dim=-1)
    if slot_ids is not None:
        slot_ids.index_copy_(0, slots, ids)
    # Padding rows ran in the scratch slot: reset it so its garbage never grows across steps.
    pools.zero_slot(pools.scratch_slot)
    return logits, ids
