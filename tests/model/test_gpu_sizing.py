"""The KV pool on CUDA is sized from the GPU's memory (``torch/launch.py``), with a stub memory
query so that the arithmetic, the profile step and the launch wiring run on the CPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tt_serve.config import ServeConfig
from tt_serve.model import launch
from tt_serve.model.spec import ModelSpec
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.model.torch.launch import ACTIVATION_PEAKS, gpu_kv_blocks

GB = 10**9


@dataclasses.dataclass
class StubMemory:
    """A device of ``total`` bytes with ``used`` in use; a profiled step peaks ``step`` bytes
    above what was allocated before it."""

    total: int
    used: int
    step: int
    calls: list[str] = dataclasses.field(default_factory=list)

    def info(self) -> tuple[int, int]:
        self.calls.append("info")
        return self.total - self.used, self.total

    def reset_peak(self) -> None:
        self.calls.append("reset_peak")

    def allocated(self) -> int:
        return self.used

    def peak(self) -> int:
        self.calls.append("peak")
        return self.used + self.step

    def release_cached(self) -> None:
        self.calls.append("release_cached")


def _cfg(path: Path, **kw: object) -> ServeConfig:
    return ServeConfig(model=str(path), device="cuda", **kw)  # type: ignore[arg-type]


def test_the_pool_takes_what_the_rest_leaves(dense_dir: Path) -> None:
    spec = ModelSpec.from_hf_dir(dense_dir)
    be = TorchBackend.from_pretrained(dense_dir)
    seen: list[int] = []
    real = be.model.hidden_states

    def counting(plan, pools, keep=None):  # type: ignore[no-untyped-def]
        seen.append(int(plan.positions.numel()))
        return real(plan, pools, keep) if keep is not None else real(plan, pools)

    be.model.hidden_states = counting  # type: ignore[method-assign]
    cfg = _cfg(dense_dir, max_batch_size=4, max_num_batched_tokens=512, gpu_memory_utilization=0.8)
    mem = StubMemory(total=80 * GB, used=3 * GB, step=2 * GB)
    s = gpu_kv_blocks(cfg, spec, be, 1024, mem)
    per_block = spec.kv_bytes_per_block(cfg.block_size, 2)  # auto dtype on CUDA: bfloat16
    slots = (4 + 1 + cfg.snapshot_slots) * spec.state_bytes_per_slot()
    want = (int(0.8 * 80 * GB) - 3 * GB - ACTIVATION_PEAKS * 2 * GB - slots) // per_block
    assert (s.num_kv_blocks, s.per_block, s.activation_peak) == (want, per_block, 2 * GB)
    assert (s.total, s.in_use, s.slots) == (80 * GB, 3 * GB, slots)
    # one step of the largest scheduled shape ran (4 rows sharing the 512-token budget), on a
    # throwaway pool that is gone again: the real pool allocates as usual afterwards
    assert seen == [512]
    assert mem.calls[:2] == ["reset_peak", "peak"] and "release_cached" in mem.calls
    assert be.pools is None
    be.allocate(num_kv_blocks=64, block_size=cfg.block_size, num_state_slots=4,
                num_snapshot_slots=2)  # fmt: skip
    with pytest.raises(RuntimeError, match="before allocate"):
        gpu_kv_blocks(cfg, spec, be, 1024, mem)


def test_too_little_gpu_memory_names_the_flags(dense_dir: Path) -> None:
    spec = ModelSpec.from_hf_dir(dense_dir)
    be = TorchBackend.from_pretrained(dense_dir)
    mem = StubMemory(total=10 * GB, used=8 * GB, step=1 * GB)
    with pytest.raises(ValueError, match="--gpu-memory-utilization") as err:
        gpu_kv_blocks(_cfg(dense_dir), spec, be, 1024, mem)
    assert "0.9 x 10.0 GB, 8.0 GB in use" in str(err.value)


def test_launch_sizes_a_cuda_pool_from_the_gpu(
    dense_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA config without kv_blocks goes through the GPU sizing; a given kv_blocks and the
    CPU keep their own sizes. (The backend is a CPU one: only the sizing is under test.)"""
    from tt_serve.model.torch import memory

    mem = StubMemory(total=40 * GB, used=1 * GB, step=GB // 2)
    monkeypatch.setattr(memory, "CudaMemory", lambda device: mem)
    monkeypatch.setattr(
        TorchBackend,
        "from_config",
        classmethod(lambda cls, cfg, spec, max_model_len: TorchBackend.from_pretrained(dense_dir)),
    )
    spec = ModelSpec.from_hf_dir(dense_dir)
    got = launch.launch_backend(_cfg(dense_dir), spec, 1024)
    want = gpu_kv_blocks(_cfg(dense_dir), spec, got.backend, 1024, mem)  # type: ignore[arg-type]
    assert got.num_kv_blocks == want.num_kv_blocks
    given = launch.launch_backend(_cfg(dense_dir, kv_blocks=77), spec, 1024)
    assert given.num_kv_blocks == 77
    cpu = launch.launch_backend(ServeConfig(model=str(dense_dir)), spec, 1024)
    assert cpu.num_kv_blocks < got.num_kv_blocks
