"""Build tt backends on the contract fake and drive them (and the torch backend) via the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.model.interface import Backend
from tt_serve.model.spec import ModelSpec
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.options import TTOptions
from tt_serve.model.tt.runtime.backend import TTBackend
from tt_serve.model.tt.runtime.build import build_backend
from tt_serve.model.tt.virtual.device import VirtualTTNN
from tt_serve.model.tt.virtual.mesh import VirtualMeshTTNN
from tt_serve.model.weights import load_weights
from tt_serve.sequence import RequestOutput, SamplingParams

BLOCK = 64
CHUNK = 128
# The trace region the hardware tier opens with; the fake charges every capture to it (an estimate
# of tt-metal's command stream, ``memory.trace_bytes``): the tiny models need a few MB.
TRACE_REGION = 64 << 20


def fake(**kw: Any) -> VirtualTTNN:
    """The contract fake as the backend tests use it: paged SDPA decode must get a program
    config (without one tt-metal spreads a head over many cores: review finding 5)."""
    kw.setdefault("require_sdpa_program_config", True)
    return VirtualTTNN(**kw)


BUILD_ARGS = ("tp", "ccl_links", "weight_cache_dir", "checkpoint", "on_capture")


def build(spec: ModelSpec, weights: Any, *, ops: Ops, **kw: Any) -> TTBackend:
    """``build_backend`` with the options as keywords: ``TTOptions`` fields and
    ``build_backend``'s own arguments (``BUILD_ARGS``); the tests' defaults are mixed weights
    and traced ``CHUNK``-token prefill buckets."""
    kw.setdefault("precision", "mixed")
    kw.setdefault("prefill_chunk", CHUNK)
    kw.setdefault("traced_prefill", True)
    args = {k: kw.pop(k) for k in BUILD_ARGS if k in kw}
    if "tp" not in args:  # the split over the open mesh, as a start's Target gives it
        args["tp"] = (
            TensorParallel.for_mesh(spec, ops.mesh) if ops.mesh else TensorParallel(spec, 1)
        )
    return build_backend(spec, weights, ops=ops, options=TTOptions(**kw), **args)


def tt_backend(path: Path, fake_ttnn: VirtualTTNN | None = None, **kw: Any) -> TTBackend:
    ops = Ops(fake_ttnn or fake())
    ops.open_device(0, trace_region_size=TRACE_REGION, l1_small_size=0)
    spec = ModelSpec.from_hf_dir(path)
    kw.setdefault("checkpoint", path)  # what keys a weight cache, when one is given
    return build(spec, load_weights(path, spec), ops=ops, **kw)


def torch_backend(path: Path) -> TorchBackend:
    return TorchBackend.from_pretrained(path)


def engine(backend: Backend, spec: ModelSpec, *, prefix_caching: bool = True) -> Engine:
    config = EngineConfig(
        scheduler=SchedulerConfig(max_batch=4, chunk=CHUNK, block_size=BLOCK, mixed_steps=False),
        num_kv_blocks=48,
        num_snapshot_slots=8,
        max_model_len=1024,
        vocab_size=spec.vocab_size,
        prefix_caching=prefix_caching,
    )
    return Engine(backend, config)


def outputs(eng: Engine, prompts: list[list[int]], params: SamplingParams) -> list[RequestOutput]:
    """Each prompt's finished output, one request after another (so later prompts can hit the
    prefix cache the earlier ones filled). A failed request's output carries its error."""
    out = []
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params)
        done = None
        while eng.has_unfinished():
            for o in eng.step():
                if o.finished:
                    done = o
        assert done is not None
        out.append(done)
    return out


def generate(eng: Engine, prompts: list[list[int]], n: int) -> list[tuple[list[int], int]]:
    """Greedy tokens and cached-token counts, one request after another."""
    greedy = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    done = outputs(eng, prompts, greedy)
    assert all(o.error is None for o in done), done
    return [(list(o.token_ids), o.cached_tokens) for o in done]


def prompt(n: int, seed: int, vocab: int = 4096) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(3, vocab, (n,), generator=g)]


def mesh_fake(n: int, **kw: Any) -> VirtualMeshTTNN:
    """The contract fake of a 1 x ``n`` mesh of P150 chips (each its own VirtualTTNN)."""
    kw.setdefault("require_sdpa_program_config", True)
    return VirtualMeshTTNN(num_devices=n, **kw)


def mesh_backend(
    path: Path, n: int, fake_mesh: VirtualMeshTTNN | None = None, **kw: Any
) -> TTBackend:
    """The tt backend tensor-parallel over a fake 1 x ``n`` mesh."""
    ops = Ops(fake_mesh or mesh_fake(n))
    ops.open_mesh((1, n), trace_region_size=TRACE_REGION, l1_small_size=0)
    spec = ModelSpec.from_hf_dir(path)
    kw.setdefault("checkpoint", path)  # what keys a weight cache, when one is given
    return build(spec, load_weights(path, spec), ops=ops, **kw)
