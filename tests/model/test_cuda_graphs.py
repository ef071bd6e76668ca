"""The bucketed (graph-captured) path of the torch backend.

On CPU the bucketed programs run eagerly through the same persistent buffers (the graph
programs' CPU twin): bucket selection, padding, the buffer refresh, the masked prefill, the
deviceResident feed and the eager fallback are all checked against the plain eager path here.
The capture itself needs CUDA; those tests skip with the reason printed.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests import numerics as nm
from tests.model import driver as d
from tt_serve.config import GDN_CHUNK
from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.model.buckets import NoBucket, choose_bucket, prefill_buckets
from tt_serve.model.interface import PAD_BLOCK, StateCopy, StepBatch, StepOutput, StepRow
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.model.torch.cuda.buffers import FlatInputs, decode_shapes
from tt_serve.model.torch.cuda.inputs import (
    decode_buckets,
    decode_values,
    prefill_values,
)
from tt_serve.sequence import SamplingParams

CUDA = torch.cuda.is_available()
NO_CUDA = "needs a CUDA device (torch.cuda.is_available() is False): CUDA graph capture"
STATIC: dict[str, Any] = dict(
    cuda_graphs=True, traced_prefill=True, device_resident=True, max_prefill_chunk=128
)
SCRATCH = 5  # the scratch slot of a backend allocated with 5 state slots


def test_bucket_selection() -> None:
    assert decode_buckets(16) == (1, 2, 4, 8, 16)
    assert decode_buckets(20) == (1, 2, 4, 8, 16, 20)
    assert decode_buckets(100) == (1, 2, 4, 8, 16, 32, 64, 100)  # up to the batch
    assert prefill_buckets(256, GDN_CHUNK, unit="the GDN chunk") == (64, 128, 256)
    assert prefill_buckets(192, GDN_CHUNK, unit="the GDN chunk") == (64, 128, 192)
    with pytest.raises(ValueError, match="GDN chunk"):
        prefill_buckets(100, GDN_CHUNK, unit="the GDN chunk")
    assert choose_bucket(5, (1, 2, 4, 8)) == 8
    assert choose_bucket(64, (64, 128)) == 64
    with pytest.raises(NoBucket):
        choose_bucket(9, (1, 2, 4, 8))


def test_padding_values() -> None:
    rows = [
        StepRow(1, (), 20, (5, 9, 3, 0), 3, True, fed=True),
        StepRow(2, (8,), 0, (4,), 1, True),
    ]
    v = decode_values(rows, bucket=4, block_size=16, width=3, scratch_slot=SCRATCH)
    assert v.ids == [0, 8, 0, 0] and v.fed == [1, 0, 0, 0]  # a fed row's id is on the device
    assert v.slots == [3, 1, SCRATCH, SCRATCH] and v.lens == [21, 1, 1, 1]
    assert v.kv_blocks == [9, 4, PAD_BLOCK, PAD_BLOCK] and v.kv_offsets == [4, 0, 0, 0]
    assert v.tables == [[5, 9, 0], [4, 0, 0], [0, 0, 0], [0, 0, 0]]
    with pytest.raises(NoBucket, match="graphs hold"):
        decode_values(rows[:1], bucket=1, block_size=16, width=1, scratch_slot=SCRATCH)

    row = StepRow(1, tuple(range(3, 73)), 64, (6, 2, 8, 5, 11), 2, True)
    p = prefill_values(
        row, bucket=128, block_size=32, width=6, conv_state_len=3, scratch_slot=SCRATCH
    )
    assert p.valid == [1] * 70 + [0] * 58
    assert p.positions[:2] == [64, 65] and p.positions[70:] == [0] * 58
    assert p.kv_blocks[0] == 8 and p.kv_blocks[69] == 11 and set(p.kv_blocks[70:]) == {PAD_BLOCK}
    assert p.table == [6, 2, 8, 5, 11, 0] and p.slot == [2]
    assert p.conv_idx == [70, 71, 72] and p.last == [69]
    idle = prefill_values(
        None, bucket=64, block_size=32, width=2, conv_state_len=3, scratch_slot=SCRATCH
    )
    assert idle.slot == [SCRATCH] and set(idle.valid) == {0} and idle.table == [0, 0]


def test_flat_inputs_refresh_in_place() -> None:
    inp = FlatInputs(decode_shapes(2, 3), torch.device("cpu"))
    ptr = inp.views["tables"].data_ptr()
    rows = [StepRow(1, (7,), 40, (5, 9, 3), 3, True)]
    inp.write(decode_values(rows, bucket=2, block_size=16, width=3, scratch_slot=SCRATCH))
    assert inp.views["tables"].data_ptr() == ptr
    assert inp.views["tables"].tolist() == [[5, 9, 3], [0, 0, 0]]
    assert inp.views["kv_blocks"].tolist() == [3, 0] and inp.views["ids"].tolist() == [7, 0]
    inp.write(decode_values([], bucket=2, block_size=16, width=3, scratch_slot=SCRATCH))
    assert inp.views["ids"].tolist() == [0, 0] and inp.views["tables"].sum() == 0


def _engine(be: TorchBackend, *, caching: bool = True, prefill_rows: int = 0) -> Engine:
    # by default every prompt prefills in each step (lockstep), so all six decode together:
    # bucket 6
    sc = SchedulerConfig(
        max_batch=6,
        max_num_batched_tokens=512,
        chunk=128,
        block_size=16,
        max_prefill_rows=prefill_rows,
    )
    cfg = EngineConfig(
        scheduler=sc,
        num_kv_blocks=400,
        num_snapshot_slots=8,
        max_model_len=1024,
        vocab_size=be.spec.vocab_size,
        prefix_caching=caching,
    )
    return Engine(be, cfg)


def _generate(eng: Engine, prompts: list[list[int]], n: int) -> list[tuple[list[int], int]]:
    sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, sp)
    done: dict[str, tuple[list[int], int]] = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finish_reason is not None:
                done[o.request_id] = (o.token_ids, o.cached_tokens)
    return [done[str(i)] for i in range(len(prompts))]


def test_bucketed_engine_equals_eager(dense_dir: Path) -> None:
    r = random.Random(0)
    head = [r.randrange(3, 4096) for _ in range(256)]
    prompts = [[r.randrange(3, 4096) for _ in range(n)] for n in (5, 64, 130, 200)]
    prompts += [head + [5, 6, 7], head + [9] * 40]
    plain = _generate(_engine(TorchBackend.from_pretrained(dense_dir)), prompts, 8)
    be = TorchBackend.from_pretrained(dense_dir, max_model_len=1024, **STATIC)
    eng = _engine(be)
    assert eng.pipelining
    got = _generate(eng, prompts, 8)
    assert [t for t, _ in got] == [t for t, _ in plain]
    assert eng.num_pipelined_steps > 0  # decode steps ran ahead of the host, fed on the device
    assert len({t for toks, _ in plain for t in toks}) > 10
    assert got[-1][1] == 256  # the warm tail ran through a tail bucket
    assert be.static is not None
    runs = be.static.programs.runs
    assert runs[("prefill", 128)] and runs[("prefill", 64)] and runs[("decode", 6)]
    assert be.static.num_fed_rows > 0


def test_one_prefill_row_per_step_fits_the_buckets(dense_dir: Path) -> None:
    """One prefill row per step (what the measured rule picks where a chunk's compute dwarfs a
    step's fixed part) through the bucketed programs: every prefill chunk replays a prefill
    bucket, decodes come in the smaller decode buckets as the requests finish in turn, and the
    tokens are the eager lockstep run's."""
    r = random.Random(1)
    prompts = [[r.randrange(3, 4096) for _ in range(n)] for n in (40, 150, 300, 90)]
    plain = _generate(_engine(TorchBackend.from_pretrained(dense_dir)), prompts, 6)
    be = TorchBackend.from_pretrained(dense_dir, max_model_len=1024, **STATIC)
    batches: list[StepBatch] = []
    submit = be.submit

    def recorded(batch: StepBatch) -> Any:
        batches.append(batch)
        return submit(batch)

    be.submit = recorded  # type: ignore[method-assign]
    got = _generate(_engine(be, prefill_rows=1), prompts, 6)
    assert [t for t, _ in got] == [t for t, _ in plain]
    assert max(sum(row.num_tokens > 1 for row in b.rows) for b in batches) == 1
    assert be.static is not None
    runs = be.static.programs.runs
    assert runs[("prefill", 128)] and runs[("prefill", 64)]
    prefill_rows = sum(row.num_tokens > 1 for b in batches for row in b.rows)
    assert sum(n for key, n in runs.items() if key[0] == "prefill") == prefill_rows  # no eager
    assert any(key[0] == "decode" and n for key, n in runs.items())


def _same(a: StepOutput, b: StepOutput, dims: nm.Dims) -> None:
    """Bucket padding changes matmul shapes, hence only the rounding order: logits within the
    derived fp32 bound (numerics.py; 6.9e-5 at |logit| 16, measured 8.6e-6), logprobs within the
    logprob bound at the tiny models' logit scale (2.0e-4, measured 9.5e-7). A padded token
    leaking into a real row moves logits by O(1)."""
    assert a.token_ids == b.token_ids
    assert a.logits.keys() == b.logits.keys()
    for i, la in a.logits.items():
        err = float(np.abs(la - b.logits[i]).max())
        assert err <= nm.logits_bound(float(np.abs(la).max()), dims)
    lp_tol = nm.logprob_bound(nm.logits_bound(nm.LOGIT_SCALE, dims), nm.LOGIT_SCALE, dims.vocab)
    for pa, pb in zip(a.logprobs, b.logprobs, strict=True):
        assert (pa is None) == (pb is None)
        if pa is not None and pb is not None:
            assert pa.keys() == pb.keys()
            assert max(abs(pa[k] - pb[k]) for k in pa) <= lp_tol


def test_outputs_and_eager_fallback(dense_dir: Path) -> None:
    dims = nm.model_dims(dense_dir)
    plain = d.backend(dense_dir, slots=5)
    # Graphs hold 10 blocks of 16 (positions < 160); prefill buckets 64 and 128.
    be = TorchBackend.from_pretrained(dense_dir, max_model_len=160, **STATIC)
    be.allocate(num_kv_blocks=6 * d.WIDTH + 1, block_size=d.BLOCK, num_state_slots=5,
                num_snapshot_slots=4)  # fmt: skip
    assert be.static is not None
    runs = be.static.programs.runs
    p = d.prompt(159, seed=3)
    steps = [
        # 150 tokens > the largest bucket: eager; 40 and 20 tokens: buckets 64 and 64.
        [
            d.row(0, p[:150], 0, top_logprobs=3),
            d.row(1, p[:40], 0, want_logits=True),
            d.row(2, p[:20], 0, sample=False),
        ],
        # Decode bucket 4, with logprobs, host logits, and a one-token prompt.
        [
            d.row(0, [p[150]], 150, top_logprobs=2),
            d.row(1, [9], 40, want_logits=True),
            d.row(2, p[20:21], 20),
            d.row(3, [4], 0),
        ],
    ]
    for step in steps:
        _same(plain.execute(StepBatch(tuple(step))), be.execute(StepBatch(tuple(step))), dims)
    assert runs[("prefill", 64)] == 2 and runs[("decode", 4)] == 1 and sum(runs.values()) == 3
    # Position 160 needs an 11th block: this decode group runs eagerly, the prefill bucketed.
    step = [d.row(0, [p[151]], 160), d.row(1, p[:100], 41)]
    _same(plain.execute(StepBatch(tuple(step))), be.execute(StepBatch(tuple(step))), dims)
    assert runs[("prefill", 128)] == 1 and sum(runs.values()) == 4


def test_a_batch_of_64_decodes_through_its_bucket(dense_dir: Path) -> None:
    """Buckets reach the max batch: 64 decode rows replay one program (no eager fallback) and
    equal the eager path."""
    dims = nm.model_dims(dense_dir)
    rows = 64
    plain = d.backend(dense_dir, blocks=rows * 2 + 1, slots=rows)
    be = TorchBackend.from_pretrained(dense_dir, max_model_len=32, **STATIC)
    be.allocate(num_kv_blocks=rows * 2 + 1, block_size=d.BLOCK, num_state_slots=rows,
                num_snapshot_slots=0)  # fmt: skip
    assert be.static is not None
    step = [StepRow(i, (3 + i,), 0, (1 + 2 * i, 2 + 2 * i), i, True) for i in range(rows)]
    _same(plain.execute(StepBatch(tuple(step))), be.execute(StepBatch(tuple(step))), dims)
    assert be.static.programs.runs[("decode", 64)] == 1


def test_moe_bucketed_equals_eager(moe_dir: Path) -> None:
    prompts = [d.prompt(n, seed=n) for n in (30, 100)]
    plain = _generate(_engine(TorchBackend.from_pretrained(moe_dir)), prompts, 5)
    got = _generate(_engine(TorchBackend.from_pretrained(moe_dir, **STATIC)), prompts, 5)
    assert got == plain


def test_fed_row_rules(dense_dir: Path) -> None:
    """Fed rows are accepted only where the previous launch left an id on the device."""
    be = TorchBackend.from_pretrained(dense_dir, max_model_len=160, **STATIC)
    be.allocate(num_kv_blocks=6 * d.WIDTH + 1, block_size=d.BLOCK, num_state_slots=5,
                num_snapshot_slots=4)  # fmt: skip
    plain = d.backend(dense_dir, slots=5)
    p = d.prompt(40, seed=5)
    first = StepBatch((d.row(0, p[:30], 0), d.row(1, p[:12], 0)))
    a, b = plain.execute(first), be.execute(first)
    assert a.token_ids == b.token_ids
    # Step n (host tokens), then step n+1 submitted before step n is read.
    t0, t1 = a.token_ids
    assert t0 is not None and t1 is not None
    step_n = StepBatch((d.row(0, [t0], 30), d.row(1, [t1], 12)))
    pend_n = be.submit(step_n)
    assert pend_n.resident_slots == {d.row(0, [t0], 30).state_slot, d.row(1, [t1], 12).state_slot}
    fed = StepBatch((d.row(0, [], 31, fed=True), d.row(1, [], 13, fed=True)))
    pend_n1 = be.submit(fed)
    out_n, out_n1 = pend_n.result(), pend_n1.result()
    ref_n = plain.execute(step_n)
    u0, u1 = ref_n.token_ids
    assert out_n.token_ids == ref_n.token_ids and u0 is not None and u1 is not None
    ref_n1 = plain.execute(StepBatch((d.row(0, [u0], 31), d.row(1, [u1], 13))))
    assert out_n1.token_ids == ref_n1.token_ids
    # Slot 2 ran nothing; a reset of slot 0 breaks its chain; prefill rows are never fed.
    with pytest.raises(ValueError, match="left no id"):
        be.submit(StepBatch((d.row(2, [], 5, fed=True),))).result()
    be.copy_states([StateCopy.reset(d.row(0, [1], 0).state_slot)])
    with pytest.raises(ValueError, match="left no id"):
        be.submit(StepBatch((d.row(0, [], 32, fed=True),))).result()
    with pytest.raises(ValueError, match="carries no token ids"):
        d.row(1, [5], 14, fed=True)
    with pytest.raises(ValueError, match="not device-resident"):
        plain.submit(StepBatch((d.row(1, [], 14, fed=True),)))


def test_device_resident_needs_graphs(dense_dir: Path) -> None:
    with pytest.raises(ValueError, match="cuda_graphs"):
        TorchBackend.from_pretrained(dense_dir, device_resident=True)


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_cuda_graphs_equal_buffered_eager(dense_dir: Path) -> None:
    prompts = [d.prompt(n, seed=n) for n in (7, 90, 300)]
    outs = []
    for capture in (False, True):
        be = TorchBackend.from_pretrained(
            dense_dir,
            device="cuda",
            capture_graphs=capture,
            **STATIC,
        )
        outs.append(_generate(_engine(be), prompts, 12))
        assert be.static is not None and be.static.programs.num_captured == (6 if capture else 0)
    assert outs[0] == outs[1]
