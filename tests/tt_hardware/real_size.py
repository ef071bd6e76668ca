"""Real-size checks of the ttnn backend, written once for any device.

Every ``check_*`` takes an *unopened* ``Ops`` (the real ttnn on a Tenstorrent card in
``tests/tt_hardware/test_real_size.py``; the numeric contract fake, ``Ops(VirtualTTNN(chip=...))``,
in ``tests/tt/runtime/test_real_size_fake.py``) and a :class:`RealSize`: a 2-layer checkpoint at
Qwen3.5-9B layer dimensions (``tests/tiny_models.make_real_dims``: one GDN layer, 16 key / 32
value heads of 128, then one gated attention layer, 16 q / 4 kv heads of 256; hidden 4096) and
the sizes to run. The same bodies therefore run in ``make test`` at the real head counts and
state sizes, which is what shows that the hardware tier is not vacuous: on the fake every device
rule of ``virtual/rules_*.py`` (core grids, SDPA shards, the trace region) is
checked at the shapes the card will see.

The backend under test is built the way ``tt-serve`` builds it (``launch.launch`` on a
``ServeConfig``: the configured trace region, precision and prefill chunk), except for the
per-layer check, which calls the layer functions eagerly. The torch reference
(``TorchBackend``, fp32) runs the same rows; results are compared by :class:`Bar`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tests import numerics as nm
from tests.tt import harness as h
from tt_serve.config import ServeConfig
from tt_serve.logprobs import top_logprobs
from tt_serve.model.buckets import choose_bucket, prefill_buckets
from tt_serve.model.draw import _kept, draw
from tt_serve.model.interface import RowSampling, StateCopy, StepBatch, StepRow
from tt_serve.model.ref.attention import AttentionWeights as RefAttention
from tt_serve.model.ref.attention import attention_forward
from tt_serve.model.ref.gdn import GdnWeights as RefGdn
from tt_serve.model.ref.gdn import gdn_forward
from tt_serve.model.ref.layers import rope_cos_sin
from tt_serve.model.ref.plan import StepPlan
from tt_serve.model.spec import ModelSpec
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.model.tt.launch import DEFAULT_L1_SMALL, launch
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.runtime.attention import AttentionWeights, attention_decode
from tt_serve.model.tt.runtime.backend import TTBackend
from tt_serve.model.tt.runtime.gdn import GdnWeights, gdn_decode
from tt_serve.model.tt.runtime.model import LM_HEAD_CHUNK
from tt_serve.model.tt.runtime.weight_cache import default_cache_dir
from tt_serve.model.weights import load_weights

SNAPSHOTS = 2


@dataclass(frozen=True)
class Bar:
    """How results are compared with the torch reference.

    ``pcc``: the floor on the Pearson correlation of a layer's output or a row's logits with the
    reference's. ``fp32``: both sides compute every op in fp32 (the contract fake), so each value
    must also lie within the derived fp32 reordering bound (``tests/numerics.py``) of the
    reference's, and the device's greedy id must be the reference's wherever the reference's top
    two logits are further apart than twice that bound."""

    pcc: float
    fp32: bool


# On a card: PCC ≈ 1 - ρ²/2 for a relative RMS error ρ. bf16 activations (unit roundoff 2^-9)
# and bf16 weights (the configured profile) give ρ ≲ 1e-2 per layer and, the errors of the two
# layers and the LM head adding, ρ ≲ 3e-2 on logits: PCC > 0.999. Over 128 teacher-forced steps
# the GDN state does not pile up error: each step scales it by exp(g) < 1 and projects it with
# I - β·k·kᵀ (|k| = 1, 0 < β < 1), a contraction, so its relative error stays that of one step.
# 0.99 (ρ ≈ 0.14, tt-metal's per-layer bar) still fails a wrong layout, head order, state row or
# position (PCC near 0).
DEVICE_BAR = Bar(pcc=0.99, fp32=False)
FP32_BAR = Bar(pcc=0.99, fp32=True)


@dataclass(frozen=True)
class RealSize:
    """A real-dims checkpoint and the sizes a run uses."""

    path: Path
    bar: Bar
    decode_steps: int  # teacher-forced decode steps (128 on a card)
    batch_steps: int  # decode steps with every row of the batch active
    prefill_chunk: int  # the largest prefill bucket
    kv_blocks: int
    max_model_len: int
    block_size: int = 64
    device_id: int = 0

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec.from_hf_dir(self.path)

    def serve_config(self, max_batch: int) -> ServeConfig:
        """What ``tt-serve --backend ttnn`` would run with (every other field its default)."""
        return ServeConfig(
            model=str(self.path),
            backend="ttnn",
            device_ids=(self.device_id,),
            max_batch_size=max_batch,
            prefill_chunk=self.prefill_chunk,
            block_size=self.block_size,
            traced_prefill=True,
            max_model_len=self.max_model_len,
        )


# ---- building and driving the backends -----------------------------------------------------
def serve_backend(ops: Ops, size: RealSize, max_batch: int) -> TTBackend:
    """The backend as ``tt-serve`` builds it (opens the device with the configured trace
    region), allocated for ``max_batch`` rows: every trace is captured by now."""
    cfg = size.serve_config(max_batch)
    be = launch(cfg, size.spec, max_model_len=size.max_model_len, ops=ops).backend
    _allocate(be, size, max_batch)
    return be


def eager_backend(ops: Ops, size: RealSize, max_batch: int) -> TTBackend:
    """The backend with nothing traced (the layer functions are called between its steps)."""
    cfg = size.serve_config(max_batch)
    spec = size.spec
    ops.open_device(size.device_id, trace_region_size=0, l1_small_size=DEFAULT_L1_SMALL)
    be = h.build(
        spec,
        load_weights(size.path, spec),
        ops=ops,
        precision=cfg.resolved_precision,
        traced_decode=False,
        traced_prefill=False,
        prefill_chunk=size.prefill_chunk,
        max_model_len=size.max_model_len,
        weight_cache_dir=default_cache_dir(),  # as from_pretrained
        checkpoint=size.path,
    )
    _allocate(be, size, max_batch)
    return be


def reference(size: RealSize, max_batch: int) -> TorchBackend:
    ref = TorchBackend.from_pretrained(size.path)
    _allocate(ref, size, max_batch)
    return ref


def _allocate(be: TTBackend | TorchBackend, size: RealSize, max_batch: int) -> None:
    be.allocate(
        num_kv_blocks=size.kv_blocks,
        block_size=size.block_size,
        num_state_slots=max_batch,
        num_snapshot_slots=SNAPSHOTS,
    )
    be.copy_states([StateCopy.reset(s) for s in range(max_batch)])


@dataclass
class Seq:
    """One sequence fed teacher-forced: ``tokens[pos]`` is the next input."""

    slot: int
    table: tuple[int, ...]
    tokens: list[int]
    pos: int = 0

    def prefill(self, n: int, *, logits: bool = True) -> StepRow:
        row = StepRow(self.slot, tuple(self.tokens[:n]), 0, self.table, self.slot, True, logits)
        self.pos = n
        return row

    def decode(self, *, logits: bool = True) -> StepRow:
        row = StepRow(
            self.slot, (self.tokens[self.pos],), self.pos, self.table, self.slot, True, logits
        )
        self.pos += 1
        return row


def sequences(size: RealSize, slots: list[int], lengths: list[int], seed: int) -> list[Seq]:
    """Sequences of ``lengths`` tokens in ``slots``, on disjoint block tables from block 1."""
    vocab, bs = size.spec.vocab_size, size.block_size
    out, nxt = [], 1
    for i, (slot, n) in enumerate(zip(slots, lengths, strict=True)):
        blocks = -(-n // bs)
        out.append(Seq(slot, tuple(range(nxt, nxt + blocks)), h.prompt(n, seed + i, vocab)))
        nxt += blocks
    if nxt > size.kv_blocks:
        raise ValueError(f"{nxt} KV blocks needed, the pool has {size.kv_blocks}")
    return out


def step_logits(be: TTBackend | TorchBackend, rows: list[StepRow]) -> np.ndarray:
    """Run one step whose rows all want logits; [rows, vocab] fp32."""
    out = be.execute(StepBatch(tuple(rows)))
    got = [out.logits[i] for i in range(len(rows))]
    assert all(g is not None for g in got)
    return np.stack(got).astype(np.float32)


def device_ids(be: TTBackend, rows: list[StepRow]) -> np.ndarray:
    """The greedy ids the last step's program picked on the device for ``rows``."""
    assert be.pools is not None
    if rows[0].num_tokens > 1:
        bufs = be.prefill_bufs[choose_bucket(rows[0].num_tokens, be.buckets)]
        return be.ops.read(bufs.out_ids).reshape(-1)[:1].astype(np.int64)
    assert be.decode_bufs is not None
    ids = be.ops.read(be.decode_bufs.out_ids).reshape(-1).astype(np.int64)
    return ids[[be.pools.row(r.state_slot) for r in rows]]


def pcc(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(np.corrcoef(a, b)[0, 1])


def assert_close(got: np.ndarray, want: np.ndarray, bar: Bar, chain: int, what: str) -> float:
    """``got`` against the reference ``want`` by ``bar``; ``chain``: the longest accumulation
    behind a value (for the fp32 bound). Returns the PCC."""
    value = pcc(got, want)
    assert value >= bar.pcc, f"{what}: PCC {value:.5f} < {bar.pcc}"
    if bar.fp32:
        tol = nm.reorder_bound(float(np.abs(want).max()), chain)
        err = float(np.abs(got - want).max())
        assert err <= tol, f"{what}: max |got - want| {err:.3g} > fp32 bound {tol:.3g}"
    return value


def check_logits(
    be: TTBackend, rows: list[StepRow], got: np.ndarray, want: np.ndarray, size: RealSize, what: str
) -> int:
    """Each row's logits against the reference's, and the device's greedy ids: an id the
    program picked must attain its row's maximum logit (ties allowed: bf16 logits tie often at a
    248k vocabulary); with fp32 numerics it must also be the reference's argmax wherever that is
    unambiguous. Returns how many ids were compared with the reference's."""
    spec = size.spec
    chain = spec.num_layers * spec.hidden_size  # nm.logits_bound's chain
    ids, compared = device_ids(be, rows), 0
    for i, row in enumerate(rows):
        label = f"{what}, slot {row.state_slot} pos {row.start_pos}"
        assert_close(got[i], want[i], size.bar, chain, label)
        assert got[i][ids[i]] == got[i].max(), f"{label}: device id {ids[i]} is not an argmax"
        if size.bar.fp32:
            top2 = np.sort(want[i])[-2:]
            if top2[1] - top2[0] > 2 * nm.reorder_bound(float(np.abs(want[i]).max()), chain):
                assert ids[i] == int(np.argmax(want[i])), f"{label}: greedy id differs"
                compared += 1
    return compared


# ---- the checks ----------------------------------------------------------------------------
def check_capture_and_batch_decode(ops: Ops, size: RealSize, max_batch: int) -> None:
    """Startup captures one trace per prefill bucket and the decode trace within the configured
    trace region (the device refuses a larger one at end_trace_capture); each bucket's trace
    then prefills a row (in slots spread over the pool, the last one included), and the decode
    trace runs ``batch_steps`` steps with all ``max_batch`` rows active, as the reference."""
    be = serve_backend(ops, size, max_batch)
    try:
        assert be.buckets == prefill_buckets(size.prefill_chunk, size.block_size, unit="block_size")
        assert be.buckets[-1] == size.prefill_chunk
        assert be.programs.num_captured == len(be.buckets) + 1
        assert all(be.programs.traced(("prefill", b)) for b in be.buckets)
        assert be.programs.traced(("decode", max_batch))
        # The traces live in the trace region (with none, tt-metal keeps them in plain DRAM and
        # nothing would bound them), and a 248k vocabulary runs the LM head in column chunks.
        assert ops.trace_region_size > 0
        assert len(be.model.lm_head) == -(-be.spec.vocab_size // LM_HEAD_CHUNK)
        ref = reference(size, max_batch)
        # Bucket b prefills b - 7 tokens (padding in every bucket), into the last slot first.
        prefilled = [max_batch - 1 - 3 * i for i in range(len(be.buckets))]
        assert min(prefilled) >= 0, "the pool has fewer rows than the check spreads buckets over"
        slots = prefilled + [s for s in range(max_batch) if s not in prefilled]
        lens = [b - 7 for b in be.buckets] + [0] * (max_batch - len(be.buckets))
        seqs = sequences(size, slots, [n + size.batch_steps for n in lens], seed=100 * max_batch)
        for seq, n in zip(seqs, lens, strict=True):
            if n:
                rows = [seq.prefill(n)]
                want = step_logits(ref, rows)
                got = step_logits(be, rows)
                check_logits(be, rows, got, want, size, f"prefill bucket of {n} tokens")
        compared = 0
        for k in range(size.batch_steps):
            rows = [s.decode() for s in seqs]
            want = step_logits(ref, rows)
            compared += check_logits(be, rows, step_logits(be, rows), want, size, f"step {k}")
        assert not size.bar.fp32 or compared >= max_batch * size.batch_steps // 2
    finally:
        be.close()


def check_teacher_forced_layers(ops: Ops, size: RealSize, max_batch: int) -> None:
    """``decode_steps`` teacher-forced decode steps of two rows after their prefills: at each
    step every device layer gets the reference's input of that layer and runs on its own state
    (GDN conv/recurrent rows, KV), so a layer's drift over the steps shows in its own PCC."""
    be = eager_backend(ops, size, max_batch)
    try:
        ref = reference(size, max_batch)
        n = [size.prefill_chunk - 56, size.prefill_chunk // 2 + 3]
        seqs = sequences(size, [1, max_batch - 2], [m + size.decode_steps for m in n], seed=7)
        for be_ in (ref, be):
            for seq, m in zip(seqs, n, strict=True):
                be_.execute(StepBatch((seq.prefill(m, logits=False),)))
        be.flush_state()
        worst = _layer_steps(be, ref, seqs, size)
        assert len(worst) == size.spec.num_layers
    finally:
        be.close()


def _layer_steps(
    be: TTBackend, ref: TorchBackend, seqs: list[Seq], size: RealSize
) -> dict[int, float]:
    """Run the teacher-forced layer comparison; the worst PCC per layer."""
    worst: dict[int, float] = {}
    for k in range(size.decode_steps):
        rows = [s.decode(logits=False) for s in seqs]
        for i, value in _layer_step(be, ref, rows, size, f"step {k}").items():
            worst[i] = min(worst.get(i, 1.0), value)
    return worst


def _layer_step(
    be: TTBackend, ref: TorchBackend, rows: list[StepRow], size: RealSize, label: str
) -> dict[int, float]:
    """One decode step of ``rows`` through the reference stack; each device layer runs on the
    reference's input of that layer (bf16 on the device) and its own state. PCC per layer."""
    spec, ops, bar = size.spec, be.ops, size.bar
    assert be.pools is not None and be.decode_bufs is not None and ref.pools is not None
    pools, bufs, num_rows = be.pools, be.decode_bufs, be.pools.num_slots
    gdn_w = {x.pool_index: x.mixer for x in be.model.layers if isinstance(x.mixer, GdnWeights)}
    attn_w = {
        x.pool_index: x.mixer for x in be.model.layers if isinstance(x.mixer, AttentionWeights)
    }
    pool_rows = [pools.row(r.state_slot) for r in rows]
    bufs.write(ops, be._decode_values(rows))
    plan = StepPlan.build(StepBatch(tuple(rows)), size.block_size, torch.device("cpu"))
    x = torch.nn.functional.embedding(plan.token_ids, ref.model.embed)
    cos, sin = rope_cos_sin(plan.positions, ref.model.inv_freq, x.dtype)
    rope = be.model.rope(bufs, num_rows, head_major=False)
    tokens = max(r.end_pos for r in rows)
    out: dict[int, float] = {}

    def device_input(hn: torch.Tensor) -> object:
        full = np.zeros((1, num_rows, spec.hidden_size), np.float32)
        full[0, pool_rows] = hn.numpy()
        return ops.upload(full, be.precision.activations)

    def compare(i: int, got: object, want: torch.Tensor, chain: int) -> None:
        rows_out = ops.read(got)[0, pool_rows]
        out[i] = assert_close(rows_out, want.numpy(), bar, chain, f"layer {i} {label}")

    def gdn(hn: torch.Tensor, w: RefGdn, j: int, keep: object = None) -> torch.Tensor:
        want = gdn_forward(hn, w, plan, ref.pools.conv[j], ref.pools.rec[j])
        xt, rpc = device_input(hn), be.model.gdn_rows_per_call
        got = gdn_decode(ops, xt, gdn_w[j], bufs, pools.conv[j], pools.rec[j], rpc)
        compare(spec.gdn_layers[j], got, want, _gdn_chain(spec, tokens))
        return want

    def attn(hn: torch.Tensor, w: RefAttention, j: int, keep: object = None) -> torch.Tensor:
        want = attention_forward(hn, w, plan, cos, sin, ref.pools.k[j], ref.pools.v[j])
        xt, sdpa = device_input(hn), be.model.sdpa_decode
        got = attention_decode(ops, xt, attn_w[j], bufs, pools.k[j], pools.v[j], rope, sdpa)
        compare(spec.attention_layers[j], got, want, _attention_chain(spec, tokens))
        return want

    with torch.no_grad():
        ref.model.run_layers(x, gdn, attn)
    return out


def _gdn_chain(spec: ModelSpec, tokens: int) -> int:
    """A GDN decode output's longest accumulation after ``tokens`` tokens: the input projection
    (hidden); the recurrent state, whose every update is a dk-long sum over the previous state
    (Δ = v - Sᵀk), so at most tokens·dk; out_proj (Hv·dv)."""
    dk, dv = spec.linear_key_head_dim, spec.linear_value_head_dim
    return spec.hidden_size + tokens * dk + spec.linear_num_value_heads * dv


def _attention_chain(spec: ModelSpec, tokens: int) -> int:
    """An attention decode output's after ``tokens`` tokens: q/k/v projections (hidden), q·k
    over head_dim, the softmax sum and the weighted sum over the tokens, o_proj (heads·hd)."""
    hd = spec.head_dim
    return spec.hidden_size + hd + 2 * tokens + spec.num_attention_heads * hd


def check_teacher_forced_logits(ops: Ops, size: RealSize, max_batch: int) -> None:
    """Two rows prefilled, then ``decode_steps`` teacher-forced decode steps through the
    captured decode trace: every step's logits against the reference's."""
    be = serve_backend(ops, size, max_batch)
    try:
        ref = reference(size, max_batch)
        n = [size.prefill_chunk - 40, 70]
        seqs = sequences(size, [max_batch - 1, 2], [m + size.decode_steps for m in n], seed=11)
        for seq, m in zip(seqs, n, strict=True):
            rows = [seq.prefill(m)]
            want = step_logits(ref, rows)
            check_logits(be, rows, step_logits(be, rows), want, size, "prefill")
        compared = 0
        for k in range(size.decode_steps):
            rows = [s.decode() for s in seqs]
            want = step_logits(ref, rows)
            compared += check_logits(be, rows, step_logits(be, rows), want, size, f"step {k}")
        assert not size.bar.fp32 or compared >= size.decode_steps
    finally:
        be.close()


def _state_rows(be: TTBackend, row: int) -> list[np.ndarray]:
    """Row ``row`` of every GDN conv and recurrent pool (the recurrent row is [32, 128, 128]
    fp32 at real dims)."""
    assert be.pools is not None
    return [be.ops.read(t)[row] for t in be.pools.conv + be.pools.rec]


def _snapshot_rows(be: TTBackend, snap: int) -> list[np.ndarray]:
    assert be.pools is not None
    return [be.ops.read(t)[snap] for t in be.pools.snap_conv + be.pools.snap_rec]


def _kv(be: TTBackend, blocks: tuple[int, ...]) -> list[np.ndarray]:
    assert be.pools is not None
    return [be.ops.read(t)[list(blocks)] for t in be.pools.k + be.pools.v]


def _equal(a: list[np.ndarray], b: list[np.ndarray], what: str) -> None:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        np.testing.assert_array_equal(x, y, err_msg=f"{what} (tensor {i})")


def _differs(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return any(not np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def check_snapshot_copies(ops: Ops, size: RealSize, max_batch: int) -> None:
    """StateCopy save / restore / reset on the real state rows, bit for bit: a save copies the
    slot's conv and recurrent rows into the snapshot; a restore after decoding brings them back
    (into the same slot and into another one) and the replayed decode repeats its logits exactly;
    a reset zeroes the slot; no copy touches another row."""
    be = serve_backend(ops, size, max_batch)
    try:
        slot, other, target = max_batch - 1, 1, 0
        steps = max(2, size.batch_steps)
        seqs = sequences(size, [slot, other], [150 + steps, 90], seed=23)
        for seq, n in zip(seqs, (150, 90), strict=True):
            be.execute(StepBatch((seq.prefill(n, logits=False),)))
        be.flush_state()
        saved, kept = _state_rows(be, slot), _state_rows(be, other)
        assert _differs(saved, _state_rows(be, target)), "the prefill left the state at zero"
        be.copy_states([StateCopy.save(slot, 1)])
        _equal(_snapshot_rows(be, 1), saved, "save")
        first = [step_logits(be, [seqs[0].decode()]) for _ in range(steps)]
        assert _differs(_state_rows(be, slot), saved), "decoding did not change the state"
        be.copy_states([StateCopy.restore(1, slot), StateCopy.restore(1, target)])
        _equal(_state_rows(be, slot), saved, "restore into the saved slot")
        _equal(_state_rows(be, target), saved, "restore into another slot")
        _equal(_state_rows(be, other), kept, "a row no copy names")
        seqs[0].pos = 150
        again = [step_logits(be, [seqs[0].decode()]) for _ in range(steps)]
        for k, (a, b) in enumerate(zip(first, again, strict=True)):
            np.testing.assert_array_equal(a, b, err_msg=f"decode step {k} after the restore")
        be.copy_states([StateCopy.reset(slot)])
        for t in _state_rows(be, slot):
            assert not t.any(), "reset left non-zero state"
        _equal(_state_rows(be, target), saved, "the restored copy after another slot's reset")
        _equal(_state_rows(be, other), kept, "a row no copy names, after the reset")
    finally:
        be.close()


def check_paused_slot(ops: Ops, size: RealSize, max_batch: int) -> None:
    """A prefilled slot left out of ``batch_steps`` decode steps of the other rows keeps its
    GDN state rows and its KV blocks bit for bit, then resumes as on the reference."""
    be = serve_backend(ops, size, max_batch)
    try:
        ref = reference(size, max_batch)
        paused, running = 2, [0, max_batch - 1, 5]
        lens = [130, 100, 60, 75]
        steps = size.batch_steps
        seqs = sequences(size, [paused, *running], [n + steps + 1 for n in lens], seed=31)
        for seq, n in zip(seqs, lens, strict=True):
            rows = [seq.prefill(n)]
            want = step_logits(ref, rows)
            check_logits(be, rows, step_logits(be, rows), want, size, "prefill")
        be.flush_state()
        state, kv = _state_rows(be, paused), _kv(be, seqs[0].table)
        others = [_state_rows(be, s.slot) for s in seqs[1:]]
        for k in range(steps):
            rows = [s.decode() for s in seqs[1:]]
            want = step_logits(ref, rows)
            check_logits(be, rows, step_logits(be, rows), want, size, f"step {k}")
        _equal(_state_rows(be, paused), state, "the paused slot's GDN state")
        _equal(_kv(be, seqs[0].table), kv, "the paused slot's KV blocks")
        for seq, before in zip(seqs[1:], others, strict=True):
            assert _differs(_state_rows(be, seq.slot), before), "a running row kept its state"
        rows = [s.decode() for s in seqs]
        want = step_logits(ref, rows)
        check_logits(be, rows, step_logits(be, rows), want, size, "resumed")
    finally:
        be.close()


# Draw settings of the sampled decode check (the engine's common ones), one per twin pair.
SAMPLED = (
    RowSampling(0.7, top_k=20),
    RowSampling(1.0, top_k=20, top_p=0.8),
    RowSampling(1.0, top_k=32, top_p=0.95),
    RowSampling(0.7, top_k=32, min_p=0.1),
)
# On a card the device's draw may differ from the host's on its own logits where bf16 rounding
# moves a cumulative-mass boundary or a tie: a wrong id order or mask misses about half the
# draws, so three quarters separates them. With fp32 numerics every draw must agree.
DEVICE_DRAW_AGREEMENT = 0.75
# Logprob tolerance on a card: bf16 logits (relative 2^-9 of |logit| <= ~30) through an fp32
# log-normaliser.
DEVICE_LOGPROB_TOL = 0.1


def check_sampled_decode(ops: Ops, size: RealSize, max_batch: int) -> None:
    """One decode step with all ``max_batch`` rows active, in twin pairs: slots 2j and 2j+1 hold
    the same sequence, so they have the same logits; slot 2j wants them, slot 2j+1 is drawn on
    the device (``SAMPLED`` settings, seeded uniforms, top-5 logprobs). Each draw must lie in
    the host's kept set of its twin's logits and equal ``sampler.draw`` of them (every draw on
    fp32 numerics, ``DEVICE_DRAW_AGREEMENT`` of them on a card); device logprobs must match
    ``top_logprobs`` of the twin's logits; the step reads back the ids, the candidates and only
    the twins' logits rows."""
    be = serve_backend(ops, size, max_batch)
    try:
        rng = np.random.default_rng(17)
        pairs = max_batch // 2
        seqs = sequences(size, list(range(max_batch)), [40] * max_batch, seed=41)
        for j in range(pairs):
            seqs[2 * j + 1].tokens = seqs[2 * j].tokens
        for seq in seqs:
            be.execute(StepBatch((seq.prefill(32, logits=False),)))
        specs = [
            dataclasses.replace(SAMPLED[j % len(SAMPLED)], uniform=float(rng.random()))
            for j in range(pairs)
        ]
        rows = []
        for j in range(pairs):
            twin, drawn = seqs[2 * j].decode(), seqs[2 * j + 1].decode(logits=False)
            rows += [twin, dataclasses.replace(drawn, top_logprobs=5, sampling=specs[j])]
        before = be.ops.bytes_read
        out = be.execute(StepBatch(tuple(rows)))
        vocab = size.spec.vocab_size
        assert be.ops.bytes_read - before == max_batch * 4 + 2 * 32 * 32 * 4 + pairs * vocab * 4
        agree = 0
        for j in range(pairs):
            logits, tok = out.logits[2 * j], out.token_ids[2 * j + 1]
            assert tok is not None
            kept, _ = _kept(logits.astype(np.float64) / specs[j].temperature, specs[j])
            assert tok in kept, f"pair {j}: draw {tok} outside the kept set"
            agree += tok == draw(logits, specs[j])
            want, got = top_logprobs(logits, tok, 5), out.logprobs[2 * j + 1]
            assert got is not None and tok in got
            tol = (vocab + 4 * float(np.abs(logits).max())) * float(np.finfo(np.float32).eps)
            tol = tol if size.bar.fp32 else DEVICE_LOGPROB_TOL
            assert abs(got[tok] - want[tok]) <= tol, f"pair {j}: logprob {got[tok]} vs {want[tok]}"
        floor = pairs if size.bar.fp32 else DEVICE_DRAW_AGREEMENT * pairs
        assert agree >= floor, f"{agree}/{pairs} device draws equal the host's"
    finally:
        be.close()
