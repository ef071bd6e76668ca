"""Tensor parallel on a real MeshDevice (1 x 2, 1 x 4, 1 x 8 and the 2-D 2 x 4 of a T3K; each
skips, with the reason printed, where ttnn sees fewer chips): greedy tokens against the torch backend's, a prefix hit
restoring every chip's snapshot shard, and the collectives' bandwidth and numerics through
``bench/kernels/tt_ccl.py``. ``tests/tt/runtime/test_tp_backend.py`` runs the same programs on the
fake mesh in ``make test``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.kernels import tt_ccl
from tests.tt import harness as h
from tt_serve.model.interface import StateCopy, StepBatch, StepRow
from tt_serve.model.spec import ModelSpec
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.model.tt.options import DEFAULT_CCL_LINKS
from tt_serve.model.tt.runtime.backend import TTBackend
from tt_serve.model.weights import load_weights

pytestmark = pytest.mark.tt_hardware
DEGREES = [2, 4, 8]
# The token and snapshot checks also run 2-D: heads over the 4 columns, every projection also
# over the 2 rows (tests/tt/runtime/test_tp_backend.py's 2-D programs, on a card).
MESHES = [*DEGREES, pytest.param((2, 4), id="2x4")]
NEW_TOKENS = 12
# Relative error of the device's logits against the reference's: bf16 activations and weights
# (the bfloat16 profile these tests run) give a relative RMS error rho <~ 3e-2 (the derivation
# above tests/tt_hardware/real_size.py DEVICE_BAR). It is taken here relative to the row's
# largest |logit| (>= its RMS: a wider margin than rho x RMS, so fewer picks count as
# decisive). A reference pick whose top-two gap is at most twice that may legitimately flip on
# the device, and greedy trajectories may part there.
LOGIT_REL_ERR = 3e-2


def _backend(path: Path, ops: Any) -> TTBackend:
    """The tensor-parallel backend on the open mesh, bf16 weights (LOGIT_REL_ERR's profile)."""
    spec = ModelSpec.from_hf_dir(path)
    return h.build(
        spec,
        load_weights(path, spec),
        ops=ops,
        prefill_chunk=h.CHUNK,
        precision="bfloat16",
    )


@pytest.fixture(scope="module")
def prompts() -> tuple[list[int], list[int]]:
    """Two prompts sharing two full chunks: the second is a warm hit at 256."""
    a = h.prompt(300, 1)
    return a, a[:256] + h.prompt(45, 2)


@pytest.fixture(scope="module")
def torch_tokens(
    hw_mesh_dense_dir: Path, prompts: tuple[list[int], list[int]]
) -> list[tuple[list[int], int]]:
    spec = ModelSpec.from_hf_dir(hw_mesh_dense_dir)
    eng = h.engine(TorchBackend.from_pretrained(hw_mesh_dense_dir), spec)
    return h.generate(eng, list(prompts), NEW_TOKENS)


def _rows(prompt: list[int], tokens: list[int], chunk: int) -> list[StepRow]:
    """Teacher forcing along ``tokens``: the prompt in chunks of at most ``chunk`` (the last
    one picks), then one decode row per token fed; the i-th picking row picks token i."""
    seq = prompt + tokens
    table = tuple(range(1, -(-len(seq) // h.BLOCK) + 1))
    rows = [
        StepRow(1, tuple(prompt[s : s + chunk]), s, table, 1, s + chunk >= len(prompt))
        for s in range(0, len(prompt), chunk)
    ]
    return rows + [StepRow(1, (seq[p],), p, table, 1, True) for p in range(len(prompt), len(seq))]


def _forced_picks(be: TTBackend, rows: list[StepRow], n: int) -> list[int]:
    """The device's picks on the first ``n`` picking rows (the logits stay on the device)."""
    be.allocate(num_kv_blocks=16, block_size=h.BLOCK, num_state_slots=2, num_snapshot_slots=1)
    be.copy_states([StateCopy.reset(1)])
    picks: list[int] = []
    for row in rows:
        if len(picks) == n:
            break
        tok = be.execute(StepBatch((row,))).token_ids[0]
        if row.sample:
            assert tok is not None
            picks.append(tok)
    return picks


def _decisive(path: Path, prompt: list[int], tokens: list[int]) -> list[bool]:
    """Per pick of the reference along its own greedy trajectory: whether its top-two gap
    exceeds twice the device's error bound (2 x LOGIT_REL_ERR x max |logit|)."""
    be = TorchBackend.from_pretrained(path)
    be.allocate(num_kv_blocks=16, block_size=h.BLOCK, num_state_slots=2, num_snapshot_slots=1)
    be.copy_states([StateCopy.reset(1)])
    out: list[bool] = []
    for row in _rows(prompt, tokens, len(prompt))[: len(tokens)]:
        logits = be.execute(StepBatch((dataclasses.replace(row, want_logits=True),))).logits[0]
        assert logits is not None and int(np.argmax(logits)) == tokens[len(out)]
        top2 = np.sort(logits)[-2:]
        out.append(bool(top2[1] - top2[0] > 2 * LOGIT_REL_ERR * float(np.abs(logits).max())))
    return out


@pytest.mark.parametrize("tt_mesh_ops", MESHES, indirect=True)
def test_tp_greedy_tokens_equal_torch(
    hw_mesh_dense_dir: Path,
    tt_mesh_ops: Any,
    prompts: tuple[list[int], list[int]],
    torch_tokens: list[tuple[list[int], int]],
) -> None:
    """Both prompts through the engine on the mesh (the second a warm hit) give the torch
    backend's greedy tokens up to the first pick the reference leaves within device precision
    (there the trajectories may part legitimately); fed the torch tokens (teacher forcing),
    the mesh picks the torch token at every decisive position (there are some: else vacuous)."""
    spec = ModelSpec.from_hf_dir(hw_mesh_dense_dir)
    n = tt_mesh_ops.num_chips
    be = _backend(hw_mesh_dense_dir, tt_mesh_ops)
    assert be.tp.degree == n and be.tp.mesh == tt_mesh_ops.mesh
    got = h.generate(h.engine(be, spec), list(prompts), NEW_TOKENS)
    be.programs.release()
    assert got[1][1] == 256, "the second prompt must be a warm prefix hit"
    compared = 0
    for (toks, _), (want, _), p in zip(got, torch_tokens, prompts, strict=True):
        decisive = _decisive(hw_mesh_dense_dir, p, want)
        k = decisive.index(False) if False in decisive else len(decisive)
        assert toks[:k] == want[:k], f"TP={n}: tokens {toks} vs torch {want} (first {k} decisive)"
        forced_be = _backend(hw_mesh_dense_dir, tt_mesh_ops)
        forced = _forced_picks(forced_be, _rows(p, want, h.CHUNK), len(want))
        forced_be.programs.release()
        for i, ok in enumerate(decisive):
            if ok:
                assert forced[i] == want[i], f"TP={n}, teacher-forced pick {i}: {forced} vs {want}"
                compared += 1
    assert compared > 0, "no decisive pick: the reference leaves every one within device error"


def _per_chip(ops: Any, pool: Any, axis: int, row: int) -> list[np.ndarray]:
    """Row ``row`` of a per-chip-sharded state pool, one array per chip (every chip's shard
    read through a concat composer, split back in mesh order)."""
    whole = ops.read_concat(pool, axis)[row]
    return np.split(whole, ops.num_chips, axis=axis - 1)


def _state(be: TTBackend, row: int) -> list[list[np.ndarray]]:
    """Every GDN layer's conv history and recurrent state of pool row ``row``, per chip."""
    assert be.pools is not None
    conv = [_per_chip(be.ops, t, 3, row) for t in be.pools.conv]  # [slots, 1, K-1, C / N]
    rec = [_per_chip(be.ops, t, 1, row) for t in be.pools.rec]  # [slots, Hv / N, dk, dv]
    return conv + rec


@pytest.mark.parametrize("tt_mesh_ops", MESHES, indirect=True)
def test_tp_snapshot_restore_on_every_chip(
    hw_mesh_dense_dir: Path, tt_mesh_ops: Any, prompts: tuple[list[int], list[int]]
) -> None:
    """A prefix hit on the mesh gives the cold run's tokens; a snapshot saved from one slot
    and restored into another brings back every chip's shard of every GDN state bit for bit
    (the copy is device-to-device on each chip), and each chip's shard is its own."""
    spec = ModelSpec.from_hf_dir(hw_mesh_dense_dir)
    ops = tt_mesh_ops
    cold_be = _backend(hw_mesh_dense_dir, ops)
    cold = h.generate(h.engine(cold_be, spec, prefix_caching=False), [prompts[1]], NEW_TOKENS)
    cold_be.programs.release()
    warm_be = _backend(hw_mesh_dense_dir, ops)
    warm = h.generate(h.engine(warm_be, spec), list(prompts), NEW_TOKENS)
    warm_be.programs.release()
    assert cold[0][1] == 0 and warm[1][1] == 256
    assert warm[1][0] == cold[0][0]

    be = _backend(hw_mesh_dense_dir, ops)
    be.allocate(num_kv_blocks=16, block_size=h.BLOCK, num_state_slots=3, num_snapshot_slots=2)
    be.copy_states([StateCopy.reset(1), StateCopy.reset(2)])
    table = (1, 2, 3, 4)
    for start in (0, h.CHUNK):
        chunk = tuple(prompts[0][start : start + h.CHUNK])
        be.execute(StepBatch((StepRow(1, chunk, start, table, 1, False),)))
    be.flush_state()
    saved = _state(be, 1)
    for layer in saved:
        assert all(chip.any() for chip in layer), "a chip's state is still zero after prefill"
        assert not np.array_equal(layer[0], layer[1]), "chips 0 and 1 hold the same shard"
    assert all(not chip.any() for layer in _state(be, 2) for chip in layer)
    be.copy_states([StateCopy.save(1, 0), StateCopy.restore(0, 2)])
    restored = _state(be, 2)
    for j, (got, want) in enumerate(zip(restored, saved, strict=True)):
        for c, (g, w) in enumerate(zip(got, want, strict=True)):
            np.testing.assert_array_equal(g, w, err_msg=f"state tensor {j}, chip {c}")
    be.programs.release()


@pytest.mark.parametrize("tt_mesh_ops", DEGREES, indirect=True)
def test_ccl_bandwidth_and_numerics(tt_mesh_ops: Any) -> None:
    """bench/kernels/tt_ccl.py's measurement at a decode-sized message ([1, 1, 32, H], H of
    Qwen3.5-9B): every collective, eager and traced, equals numpy exactly (integer inputs a
    bf16 sum keeps exact) and achieves a positive bandwidth."""
    n = tt_mesh_ops.num_chips
    hidden = tt_ccl.hidden_sizes(["qwen3.5-9b"])["qwen3.5-9b"]
    b = tt_ccl.Bench(tt_mesh_ops, n, DEFAULT_CCL_LINKS)
    for coll in tt_ccl.COLLECTIVES:
        r = tt_ccl.measure(b, tt_ccl.Case(coll, 32, hidden), warmup=1, iters=5, rounds=1)
        assert r["exact"], f"{coll} on 1 x {n}: {r['max_abs_error']}"
        for mode in tt_ccl.MODES:
            assert r[mode]["latency_us"] > 0 and r[mode]["algbw_gbps"] > 0, (coll, mode, r)
            assert r[mode]["busbw_gbps"] == pytest.approx(
                r[mode]["algbw_gbps"] * tt_ccl.bus_factor(coll, n)
            )
