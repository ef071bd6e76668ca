"""Device rules of Gated DeltaNet, which ``gdn.py`` applies: the fused recurrent (decode) and
chunked (prefill) gated delta rules (conventions: ``rules_base.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from tt_serve.model.tt.boards import ChipSpec
from tt_serve.model.tt.virtual.rules_base import TILE, TensorInfo, _fail


def fused_recurrent_gated_delta_rule(
    chip: ChipSpec, q: TensorInfo, v: TensorInfo, initial_state: TensorInfo | None
) -> None:
    """transformer/fused_recurrent_gated_delta_rule/device/
    fused_recurrent_gated_delta_rule_program_factory.cpp: one Tensix core per (batch, value head),
    ``TT_FATAL(BH <= grid.x * grid_y, "num_heads {} exceeds compute cores {}")`` (0.81.1: present;
    the 0.81.1 docstring: "one Tensix core per head"). The device op wants key/value dims that are
    non-zero multiples of 32 and a state [B, HV, K, V]."""
    b, hv, k, vd = q.shape[0], v.shape[2], q.shape[3], v.shape[3]
    bh = b * hv
    _fail(
        "fused_recurrent_gated_delta_rule.cores",
        bh <= chip.num_cores,
        f"B*HV = {b}*{hv} = {bh} heads need one core each; the {chip.arch} grid has "
        f"{chip.grid_x}x{chip.grid_y} = {chip.num_cores} (TT_FATAL 'num_heads {bh} exceeds compute "
        f"cores {chip.num_cores}'): run the decode batch in groups of <= {chip.num_cores // hv} rows",
    )
    _fail(
        "fused_recurrent_gated_delta_rule.shape",
        k % TILE == 0 and vd % TILE == 0 and k > 0 and vd > 0,
        f"key_dim {k} and val_dim {vd} must be non-zero multiples of {TILE}",
    )
    if initial_state is not None:
        _fail(
            "fused_recurrent_gated_delta_rule.shape",
            initial_state.shape == (b, hv, k, vd),
            f"initial_state {initial_state.shape} must be [B, HV, K, V] = {(b, hv, k, vd)}",
        )


def chunk_gated_delta_rule(
    chip: ChipSpec,
    qkv: Sequence[TensorInfo],
    g: TensorInfo,
    beta: TensorInfo,
    initial_state: TensorInfo | None,
    chunk_size: int,
    consts: Sequence[TensorInfo],
) -> None:
    """transformer/chunk_gated_delta_rule (0.81.1 docstring and device ops): every input TILE ("a
    ROW_MAJOR input fails the device op's validation"); chunk_size 32 or 64 ("chunk_gdn:
    chunk_size must be 32 or 64"); the rank-3 flat path needs K == V, chunk 32 and T a multiple of
    32; g/beta [B, T, HV] ("chunk_gdn: {} must be [B, T, HV]"); constant tiles fp32 TILE. Cores: the
    fused path needs BH*(NV+NP) cores and otherwise falls back to the phased path, whose scan runs
    one core per head: chunk_gdn_phased_program_factory.cpp distribute_scan
    ``TT_FATAL(BH <= ncores, "num_heads {} exceeds compute cores {}")`` (0.81.1: present)."""
    q, v = qkv[0], qkv[2]
    for t in (*qkv, g, beta, *([initial_state] if initial_state else []), *consts):
        _fail("chunk_gated_delta_rule.layout", t.tile, f"operand {t.shape} must be TILE")
    for t in consts:
        _fail("chunk_gated_delta_rule.dtype", t.dtype == "float32", "eye/tril/ones/masks fp32")
    _fail("chunk_gated_delta_rule.chunk", chunk_size in (32, 64), f"chunk_size {chunk_size}")
    b, t_len, hv = g.shape[0], g.shape[1], g.shape[-1]
    _fail(
        "chunk_gated_delta_rule.shape",
        len(g.shape) == 3 and beta.shape == g.shape and q.shape[:2] == (b, t_len),
        f"g {g.shape} and beta {beta.shape} must be [B, T, HV] with q's B, T {q.shape[:2]}",
    )
    if len(q.shape) == 3:
        dv = initial_state.shape[3] if initial_state else v.shape[2] // hv
        dk = initial_state.shape[2] if initial_state else dv
        _fail(
            "chunk_gated_delta_rule.flat",
            chunk_size == 32 and t_len % 32 == 0 and dk == dv,
            f"the rank-3 flat path needs chunk_size 32 (got {chunk_size}), T % 32 == 0 (T = "
            f"{t_len}) and K == V (K = {dk}, V = {dv})",
        )
    if initial_state is not None:
        _fail(
            "chunk_gated_delta_rule.shape",
            initial_state.shape[:2] == (b, hv),
            f"initial_state {initial_state.shape} must be [B, HV, K, V] with B={b}, HV={hv}",
        )
    _fail(
        "chunk_gated_delta_rule.cores",
        b * hv <= chip.num_cores,
        f"B*HV = {b}*{hv} = {b * hv} scan heads need one core each; the grid has "
        f"{chip.num_cores}: prefill fewer rows per call",
    )
