"""``torch/footprint.decode_read`` (the bytes a batch-1 decode step reads, from the spec alone:
what ``tt-serve plan --backend torch`` prints) equals the bytes the built model holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tt_serve.model.kernels import native
from tt_serve.model.precision import PROFILES
from tt_serve.model.published import published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.model.torch.footprint import decode_read, held_read

KERNELS = native.kernels()
needs_kernel = pytest.mark.skipif(
    KERNELS is None or not KERNELS.linear_compiled, reason="no AVX2 + FMA build of native.c"
)


@needs_kernel
@pytest.mark.parametrize("profile", [None, *PROFILES])
@pytest.mark.parametrize("which", ["dense_dir", "tied_dir"])
def test_the_spec_s_bytes_are_the_built_model_s(
    which: str, profile: str | None, request: pytest.FixtureRequest
) -> None:
    path: Path = request.getfixturevalue(which)
    be = TorchBackend.from_pretrained(path, precision=profile)
    assert decode_read(be.spec, profile) == held_read(be.model)


def test_lighter_profiles_read_less_at_the_published_shapes() -> None:
    for size in ("qwen3.5-0.8b", "qwen3.5-9b"):
        spec = ModelSpec.from_config(dict(published_config(size)), model_id=size)
        reads = [decode_read(spec, p).total for p in (None, "mixed", "bfp4-mlp")]
        assert reads == sorted(reads, reverse=True) and reads[-1] < reads[0] / 3
    spec = ModelSpec.from_config(dict(published_config("qwen3.5-0.8b")), model_id="0.8b")
    # bench/runs/block-float.jsonl measured these off the built 0.8B shape: 2.24 / 0.80 GB
    assert round(decode_read(spec).total / 1e9, 2) == 2.24
    assert round(decode_read(spec, "mixed").total / 1e9, 2) == 0.80


def test_plan_prints_every_profile_s_bytes_for_the_torch_backend() -> None:
    cmd = [sys.executable, "-m", "tt_serve.cli", "plan", "--backend", "torch"]
    r = subprocess.run([*cmd, "--model", "qwen3.5-0.8b"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines()[2:6]}
    assert list(rows) == ["float32", *PROFILES]
    assert rows["mixed"][-2:] == ["0.80", "GB"] and rows["float32"][-2:] == ["2.24", "GB"]
    j = subprocess.run([*cmd, "--model", "qwen3.5-9b", "--json"], capture_output=True, text=True)
    spec = ModelSpec.from_config(dict(published_config("qwen3.5-9b")), model_id="9b")
    got = json.loads(j.stdout)["decode_read_bytes"]["bfp4-mlp"]["total"]
    assert got == decode_read(spec, "bfp4-mlp").total
    bad = subprocess.run([*cmd, "--model", "no-such-model"], capture_output=True, text=True)
    assert bad.returncode == 2 and "tt-serve plan: error:" in bad.stderr
