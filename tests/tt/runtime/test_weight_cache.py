"""The converted-weight cache: mesh entries (a mesh start after the first converts nothing),
atomic publication (a killed or failing writer leaves nothing a reader takes), and the
checkpoint's content in the key (a rewritten checkpoint of the same shapes misses)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.tt import harness as h
from tt_serve.model.precision import Precision
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout.host import to_numpy
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.runtime import weight_cache, weights
from tt_serve.model.tt.runtime.weight_cache import MANIFEST, TEMP_MARK, WeightCache
from tt_serve.model.weights import load_weights

ROOT = Path(__file__).resolve().parents[3]


class Source:
    """The checkpoint as ``build_backend`` reads it on a miss, counting the reads."""

    def __init__(self, path: Path) -> None:
        self.path, self.calls = path, 0

    def __call__(self) -> dict[str, np.ndarray]:
        self.calls += 1
        return to_numpy(load_weights(self.path, ModelSpec.from_hf_dir(self.path)))


def _ops(mesh: tuple[int, int]) -> Ops:
    if mesh == (1, 1):
        ops = Ops(h.fake())
        ops.open_device(0, trace_region_size=h.TRACE_REGION, l1_small_size=0)
    else:
        ops = Ops(h.mesh_fake(mesh[0] * mesh[1]))
        ops.open_mesh(mesh, trace_region_size=h.TRACE_REGION, l1_small_size=0)
    return ops


def _start(
    ckpt: Path, cache: Path, mesh: tuple[int, int] = (1, 1), **kw: Any
) -> tuple[Any, Source]:
    src = Source(ckpt)
    be = h.build(
        ModelSpec.from_hf_dir(ckpt),
        src,
        ops=_ops(mesh),
        prefill_chunk=h.CHUNK,
        weight_cache_dir=cache,
        checkpoint=ckpt,
        **kw,
    )
    return be, src


def _entries(cache: Path) -> list[Path]:
    return sorted(p.parent for p in cache.glob(f"*/{MANIFEST}") if TEMP_MARK not in p.parent.name)


def _temps(cache: Path) -> list[Path]:
    return sorted(cache.glob(f"*{TEMP_MARK}*"))


def _per_chip(t: Any) -> list[torch.Tensor]:
    """A device weight's values on every chip (the contract fake's buffers)."""
    return [s.buffer.data for s in getattr(t, "shards", [t])]


def _device_weights(
    ckpt: Path, mesh: tuple[int, int], cache: WeightCache | None, source: Callable[[], Any]
) -> dict[str, Any]:
    spec = ModelSpec.from_hf_dir(ckpt)
    ops = _ops(mesh)
    tp = TensorParallel.for_mesh(spec, mesh)
    return weights.load_device_weights(ops, spec, Precision(), source, cache, tp)


@pytest.mark.parametrize("mesh", [(1, 2), (2, 4)])
def test_a_mesh_entry_loads_every_chip_its_shard(
    dense_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mesh: tuple[int, int]
) -> None:
    """A mesh start writes the laid-out shards; the next loads them onto every chip exactly as a
    start without the cache uploads them, and neither reads the checkpoint nor lays it out."""
    cache = WeightCache(tmp_path, dense_dir)
    src = Source(dense_dir)
    fresh = _device_weights(dense_dir, mesh, None, src)
    first = _device_weights(dense_dir, mesh, cache, src)
    assert src.calls == 2 and len(_entries(tmp_path)) == 1

    def no_layout(*a: Any, **k: Any) -> Any:
        raise AssertionError("a cache hit lays nothing out")

    monkeypatch.setattr(weights, "layout_weights", no_layout)
    monkeypatch.setattr(TensorParallel, "layout", no_layout)
    hit = _device_weights(dense_dir, mesh, cache, src)
    assert src.calls == 2
    assert fresh.keys() == first.keys() == hit.keys()
    for name in fresh:
        want = _per_chip(fresh[name])
        for got in (_per_chip(first[name]), _per_chip(hit[name])):
            assert len(got) == len(want) == mesh[0] * mesh[1]
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), name


def test_a_second_mesh_start_converts_nothing(
    dense_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = ModelSpec.from_hf_dir(dense_dir)
    first, src1 = _start(dense_dir, tmp_path, (1, 2))
    calls = {"layout": 0}
    real = weights.layout_weights

    def counted(*a: Any, **k: Any) -> Any:
        calls["layout"] += 1
        return real(*a, **k)

    monkeypatch.setattr(weights, "layout_weights", counted)
    second, src2 = _start(dense_dir, tmp_path, (1, 2))
    assert (src1.calls, src2.calls, calls["layout"]) == (1, 0, 0)
    p = [h.prompt(70, 3)]
    assert h.generate(h.engine(first, spec), p, 4) == h.generate(h.engine(second, spec), p, 4)
    # The mesh is in the key: one chip (or another mesh) does not take the 1 x 2 shards.
    _, single = _start(dense_dir, tmp_path)
    assert single.calls == 1 and len(_entries(tmp_path)) == 2


_KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from tests.tt import harness as h
from tt_serve.model.tt.ops import Ops

written = []
real = Ops.dump

def dump(self, path, host):
    if len(written) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    written.append(path)
    real(self, path, host)

Ops.dump = dump
h.tt_backend(Path(sys.argv[1]), weight_cache_dir=Path(sys.argv[2]))
"""


def test_a_killed_writer_leaves_no_readable_entry(dense_dir: Path, tmp_path: Path) -> None:
    """A writer killed after three tensor files leaves only its temporary folder: the next start
    converts again and publishes, the leftover is never read, and a later write removes it
    once it is old."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", _KILLED_WRITER, str(dense_dir), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, timeout=600, check=False)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    (left,) = _temps(tmp_path)
    assert sorted(p.name for p in left.iterdir()) == [f"{i}.tensorbin" for i in range(3)]
    assert _entries(tmp_path) == [] and not (tmp_path / left.name.split(TEMP_MARK)[0]).exists()

    _, src = _start(dense_dir, tmp_path)
    assert src.calls == 1 and len(_entries(tmp_path)) == 1
    assert _temps(tmp_path) == [left]  # a day-old temp folder only is a dead writer's
    _, again = _start(dense_dir, tmp_path)
    assert again.calls == 0
    old = time.time() - 2 * weight_cache.STALE_TEMP_S
    os.utime(left, (old, old))
    _start(dense_dir, tmp_path, precision="bfloat16")  # another key: a write
    assert _temps(tmp_path) == [] and len(_entries(tmp_path)) == 2


@pytest.mark.parametrize("error", [RuntimeError, OSError])
def test_a_failed_write_publishes_nothing(
    dense_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    """A dump failing half-way removes the temporary folder and publishes nothing: an error
    fails the start, a file-system error (a full disk) only skips the cache; the next start
    converts and publishes."""
    real, written = Ops.dump, list[Path]()

    def failing(self: Ops, path: Path, host: Any) -> None:
        if len(written) == 5:
            raise error("no space left on device")
        written.append(path)
        real(self, path, host)

    monkeypatch.setattr(Ops, "dump", failing)
    if error is OSError:
        _start(dense_dir, tmp_path)
    else:
        with pytest.raises(RuntimeError, match="no space"):
            _start(dense_dir, tmp_path)
    assert _entries(tmp_path) == [] and _temps(tmp_path) == []
    assert [p for p in tmp_path.iterdir() if p.name != "checkpoints"] == []
    monkeypatch.setattr(Ops, "dump", real)
    _, src = _start(dense_dir, tmp_path)
    assert src.calls == 1 and len(_entries(tmp_path)) == 1


def test_two_writers_of_one_key_publish_one_entry(dense_dir: Path, tmp_path: Path) -> None:
    """Replicas starting together both convert; the second rename finds the first one's entry
    and discards its own. A damaged entry of the key (a file missing) is never read and is
    replaced by the next write."""
    spec = ModelSpec.from_hf_dir(dense_dir)
    cache = WeightCache(tmp_path, dense_dir)
    entry = cache.entry(spec, Precision(), "sparse", TensorParallel(spec, 1))

    def dump(path: Path, name: str) -> None:
        path.write_text(name)

    assert entry.write(["a", "b"], dump) is True
    assert entry.write(["a", "b"], dump) is False
    assert entry.names() == ["a", "b"] and _temps(tmp_path) == []
    entry.file(1).unlink()
    assert entry.names() is None
    assert entry.write(["a", "b"], dump) is True and entry.names() == ["a", "b"]
    assert _temps(tmp_path) == []


def _rewrite_norm(ckpt: Path, how: str) -> np.ndarray:
    """New values for the final norm, same names, shapes, dtypes and file size: ``resave``
    writes a new file (as a training run's save does); ``in-place`` overwrites the tensor's
    bytes in the same file and puts its times back (only the ctime tells)."""
    f = ckpt / "model.safetensors"
    st = f.stat()
    tensors = load_file(f)
    name = next(n for n in tensors if n.endswith("norm.weight") and ".layers." not in n)
    new = tensors[name] * 2 + 0.5
    if how == "resave":
        tensors[name] = new
        save_file(tensors, f, metadata={"format": "pt"})
    else:
        header_len = int.from_bytes(f.read_bytes()[:8], "little")
        first, end = json.loads(f.read_bytes()[8 : 8 + header_len])[name]["data_offsets"]
        with f.open("r+b") as out:
            out.seek(8 + header_len + first)
            data = new.contiguous().numpy().tobytes()
            assert len(data) == end - first
            out.write(data)
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert f.stat().st_ino == st.st_ino and f.stat().st_mtime_ns == st.st_mtime_ns
    assert f.stat().st_size == st.st_size
    return new.float().numpy()


@pytest.mark.parametrize("how", ["resave", "in-place"])
def test_a_rewritten_checkpoint_of_the_same_shapes_misses(
    dense_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    ckpt = Path(shutil.copytree(dense_dir, tmp_path / "ckpt"))
    cache = WeightCache(tmp_path / "cache", ckpt)
    src = Source(ckpt)
    _device_weights(ckpt, (1, 1), cache, src)
    # A restart stats the files and takes their digests from beside the cache: nothing reread.
    real_digest = weight_cache.hashlib.file_digest

    def no_rehash(*a: Any, **k: Any) -> Any:
        raise AssertionError("an unchanged checkpoint is not hashed again")

    monkeypatch.setattr(weight_cache.hashlib, "file_digest", no_rehash)
    _device_weights(ckpt, (1, 1), cache, src)
    assert src.calls == 1
    monkeypatch.setattr(weight_cache.hashlib, "file_digest", real_digest)

    new = _rewrite_norm(ckpt, how)
    got = _device_weights(ckpt, (1, 1), cache, src)
    assert src.calls == 2 and len(_entries(tmp_path / "cache")) == 2
    want = (1.0 + new).reshape(1, 1, -1, 32)  # the Qwen RMSNorm weight as the device holds it
    np.testing.assert_array_equal(_per_chip(got["norm"])[0].numpy(), want)
    hit = _device_weights(ckpt, (1, 1), cache, src)
    assert src.calls == 2
    np.testing.assert_array_equal(_per_chip(hit["norm"])[0].numpy(), want)


def test_the_cache_needs_the_checkpoint_folder(dense_dir: Path, tmp_path: Path) -> None:
    spec = ModelSpec.from_hf_dir(dense_dir)
    with pytest.raises(ValueError, match="weight_cache_dir needs checkpoint"):
        h.build(spec, Source(dense_dir), ops=_ops((1, 1)), weight_cache_dir=tmp_path)
