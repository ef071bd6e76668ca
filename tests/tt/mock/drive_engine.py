"""Run by the ttnn venv (Python 3.12) on a mock box: a tiny hybrid model through the
engine on the real ttnn 0.81.1, every op validated and allocated by tt-metal (reads are zeros, so
tokens mean nothing here; the virtual device checks tokens).

stdin: {"config": <config.json>, "eviction": bool, "traced": bool, "trace_region": bytes}.
Prints one ``MOCK_ENGINE <json>`` line: per request its tokens' count, cached tokens and error;
the engine's pool counters; the number of ttnn calls and of traces; and the allocator's DRAM per
bank after the run.

Covered: startup (weights uploaded from numpy, pools), chunked prefill (two chunks), decode at
batch 3, device sampling (temperature with top_k), a prefix hit (KV pages + GDN snapshot
restore), snapshot save / reset, and with ``eviction`` a KV pool small enough that the third
request evicts the first's cached blocks. With ``traced`` the decode step is a trace, captured,
replayed and released by tt-metal as on a card (the mock trace shim, scripts/mock-trace-shim.c,
preloaded by the caller), in a trace region of ``trace_region`` bytes; else every program eager.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import ttnn

from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout.host import shape_only_weights
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.ops import DEFAULT_L1_SMALL, Ops
from tt_serve.model.tt.options import TTOptions
from tt_serve.model.tt.plan.oplog import OpLog, Recorder
from tt_serve.model.tt.runtime.build import build_backend
from tt_serve.sequence import SamplingParams

MARK = "MOCK_ENGINE "
CHUNK, BLOCK = 128, 64


def main() -> None:
    job = json.loads(sys.stdin.read())
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(job["config"]))
        spec = ModelSpec.from_hf_dir(tmp)
    rng = np.random.default_rng(0)
    weights = {
        n: (rng.standard_normal(a.shape) * 0.02).astype(np.float32)
        for n, a in shape_only_weights(spec).items()
    }
    log = OpLog(None)
    ops = Ops(Recorder(ttnn, log))
    traced = bool(job.get("traced"))
    region = int(job.get("trace_region", 0)) if traced else 0
    ops.open_device(0, trace_region_size=region, l1_small_size=DEFAULT_L1_SMALL)
    backend = build_backend(
        spec,
        lambda: weights,
        ops=ops,
        tp=TensorParallel(spec, 1),
        options=TTOptions(
            precision="mixed", prefill_chunk=CHUNK, traced_decode=traced, traced_prefill=False
        ),
    )
    blocks = 12 if job.get("eviction") else 48
    engine = Engine(
        backend,
        EngineConfig(
            scheduler=SchedulerConfig(
                max_batch=4, chunk=CHUNK, block_size=BLOCK, mixed_steps=False
            ),
            num_kv_blocks=blocks,
            num_snapshot_slots=4,
            max_model_len=1024,
            vocab_size=spec.vocab_size,
            prefix_caching=True,
        ),
    )
    head = list(range(3, 3 + 300))
    prompts = [
        ("cold", head, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)),
        (
            "hit",
            [*head[:280], 7, 8, 9],
            SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
        ),
        (
            "drawn",
            [11] * 200,
            SamplingParams(max_tokens=6, temperature=0.8, top_k=20, seed=1, ignore_eos=True),
        ),
    ]
    out: dict[str, dict[str, object]] = {}
    # one after another (the hit needs the cold run's cache), then all three decode together
    for rid, ids, params in prompts[:2]:
        engine.add_request(rid, ids, params)
        _drain(engine, out)
    for rid, ids, params in prompts:
        engine.add_request(rid + "-again", ids, params)
    _drain(engine, out)
    view = ops.memory_view("DRAM")
    result = {
        "requests": out,
        "ops": log.count,
        "traces": backend.programs.num_captured,
        "replays": sum(n for k, n in backend.programs.runs.items() if backend.programs.traced(k)),
        "dram_per_bank": view.allocated_per_bank,
        "stats": dataclasses.asdict(engine.stats()),
    }
    backend.close()  # the traces released, then the device closed
    print(MARK + json.dumps(result), flush=True)


def _drain(engine: Engine, out: dict[str, dict[str, object]]) -> None:
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                out[o.request_id] = {
                    "tokens": len(o.token_ids),
                    "cached": o.cached_tokens,
                    "error": o.error,
                }


if __name__ == "__main__":
    main()
