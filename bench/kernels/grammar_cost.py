"""What constrained decoding costs on the host: grammar compile time per schema, mask time per
token, the bitmask step of the sampler, and engine step time with and without a constrained row
in the same batch.

The grammars are the server's (``tt_serve/agents``) over the real Qwen3.5 vocabulary
(248,320 logits). Mask times come from walks through each grammar with random allowed tokens.
The batch comparison runs the engine on the torch-free fake backend (tests/engine), so the
step time is host work only: it does not include a device's logits read-back (about 1 MB of
float32 per constrained row per step) nor the loss of decode pipelining while a constrained row
runs (counted separately in the engine's pipelined_decode_steps). One ledger line goes to
``bench/runs/grammar-cost.jsonl``.

    python -m bench.kernels.grammar_cost
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.provenance import REPO_ROOT, git_info, machine_info
from tests.engine.fake_backend import FakeBackend
from tt_serve.agents.constraints import tool_call_lark
from tt_serve.agents.grammar import GrammarCompiler, json_schema_lark
from tt_serve.engine import sampler
from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.qwen_vocab import ENDOFTEXT_ID, IM_END_ID, build_tokenizer
from tt_serve.sequence import SamplingParams
from tt_serve.tokenizer import Tokenizer

VOCAB = 248320
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
                "required": ["query"],
            },
        },
    },
]
ANSWER = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 32},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        "meta": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "ratio": {"type": "number"}},
            "required": ["ok"],
        },
    },
    "required": ["answer", "score"],
}
GRAMMARS = {
    "json_object": json_schema_lark({"type": "object"}),
    "json_schema": json_schema_lark(ANSWER),
    "tool_named": tool_call_lark(TOOLS, "get_weather", parallel=False, reasoning=False),
    "tool_required_2": tool_call_lark(TOOLS, None, parallel=True, reasoning=False),
}
EOS = (IM_END_ID, ENDOFTEXT_ID)


def _walk_mask_times(compiler: GrammarCompiler, source: str, steps: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    mask = np.zeros(VOCAB // 32, dtype=np.int32)
    m = compiler.lark(source).matcher()
    times: list[float] = []
    for _ in range(steps):
        t0 = time.perf_counter()
        m.fill_bitmask(mask)
        times.append(time.perf_counter() - t0)
        allowed = np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))
        tok = int(rng.choice(allowed))
        if tok in EOS:
            m = compiler.lark(source).matcher()
            continue
        assert m.accept(tok), m.error()
    return times


def _batch_step_ms(constrained: Any, steps: int) -> tuple[float, int]:
    cfg = EngineConfig(
        scheduler=SchedulerConfig(max_batch=8, chunk=64, block_size=16),
        num_kv_blocks=512,
        num_snapshot_slots=8,
        max_model_len=4096,
        vocab_size=VOCAB,
        eos_token_ids=frozenset(EOS),
    )
    eng = Engine(FakeBackend(vocab=VOCAB), cfg)
    for i in range(8):
        grammar = constrained if i == 0 else None
        params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=grammar is None)
        if grammar is not None:
            params = SamplingParams(max_tokens=steps, temperature=1.0, seed=i, grammar=grammar)
        eng.add_request(f"r{i}", list(range(1 + i, 40 + i)), params)
    eng.step()  # prefill
    times: list[float] = []
    while eng.has_unfinished() and len(times) < steps - 2:
        active = constrained is None or any(r.request_id == "r0" for r in eng.scheduler.running)
        t0 = time.perf_counter()
        eng.step()
        if active:
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times), len(times)


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.kernels.grammar_cost", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--steps", type=int, default=400, help="mask fills per grammar")
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "bench/runs/grammar-cost.jsonl")
    args = ap.parse_args()
    t0 = time.perf_counter()
    tok = Tokenizer(build_tokenizer(), eos_token="<|im_end|>")
    compiler = GrammarCompiler(tok, VOCAB, EOS)
    tokenizer_s = time.perf_counter() - t0
    results: dict[str, Any] = {}
    for name, source in GRAMMARS.items():
        t0 = time.perf_counter()
        grammar = compiler.lark(source)
        compile_ms = 1000 * (time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert compiler.lark(source) is grammar
        hit_us = 1e6 * (time.perf_counter() - t0)
        t0 = time.perf_counter()
        grammar.matcher()
        copy_us = 1e6 * (time.perf_counter() - t0)
        masks = sorted(_walk_mask_times(compiler, source, args.steps, seed=1))
        results[name] = {
            "compile_ms": round(compile_ms, 3),
            "cache_hit_us": round(hit_us, 1),
            "matcher_copy_us": round(copy_us, 1),
            "mask_us_median": round(1e6 * statistics.median(masks), 1),
            "mask_us_p99": round(1e6 * masks[int(0.99 * (len(masks) - 1))], 1),
            "mask_us_max": round(1e6 * masks[-1], 1),
        }
        print(name, results[name])
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(VOCAB) * 3).astype(np.float32)
    mask = np.full(VOCAB // 32, -1, dtype=np.int32)
    reps = [0.0] * 50
    for i in range(50):
        t0 = time.perf_counter()
        sampler.apply_token_bitmask(logits, mask)
        reps[i] = time.perf_counter() - t0
    apply_us = 1e6 * statistics.median(reps)
    free_ms, n_free = _batch_step_ms(None, 64)
    grammar = compiler.lark(GRAMMARS["json_schema"])
    mixed_ms, n_mixed = _batch_step_ms(grammar, 64)
    batch = {
        "rows": 8,
        "greedy_only_step_ms": round(free_ms, 3),
        "one_constrained_step_ms": round(mixed_ms, 3),
        "steps_measured": [n_free, n_mixed],
    }
    print("apply_bitmask_us", round(apply_us, 1), "batch", batch)
    line = {
        "bench": "grammar_cost",
        "timestamp": time.time(),
        "git": git_info(),
        "machine": machine_info(),
        "params": {"vocab": VOCAB, "mask_steps": args.steps, "engine": "llguidance==1.9.1"},
        "tokenizer_build_s": round(tokenizer_s, 2),
        "grammars": results,
        "apply_bitmask_us": round(apply_us, 1),
        "batch": batch,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
