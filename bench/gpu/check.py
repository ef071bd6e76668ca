"""CUDA graph check for the torch backend, on a random-weight Qwen3.5 model built in memory.

Usage: python -m bench.gpu.check [--device cuda] [--tiny] [--dtype bfloat16] [--ledger PATH]

Needs only torch and numpy (no checkpoint, no safetensors, no transformers). Checks, each a
pass/fail line, then one JSON ledger line (appended to --ledger, and to $OUT/gpu-check.jsonl
when $OUT is set):

* graphs == the same bucketed programs run eagerly (exact: a replay must not change a token);
* graphs vs the plain eager path (reported as a match rate; kernels differ by shape, so an
  occasional near-tie may flip in bf16);
* warm (prefix hit) == cold tokens on the graph backend;
* deviceResident fed decode rows (and equal tokens);
* timings: decode step (eager vs graph) per batch size, cold vs warm TTFT.

``--device cpu --tiny`` is the dry run (the CPU twin of every path; a test runs it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.common.provenance import arguments, git_info, machine_info
from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.model.interface import StepBatch, StepRow
from tt_serve.model.spec import ModelSpec
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.sequence import SamplingParams

# About 0.75 B parameters (tied embeddings): the Qwen3.5-0.8B shape.
FULL = dict(
    hidden=1024, layers=24, heads=8, head_dim=256, inter=3584, vocab=248320, lin_heads=16, dim=128
)
TINY = dict(hidden=128, layers=4, heads=4, head_dim=64, inter=256, vocab=512, lin_heads=4, dim=32)


def make_config(s: dict[str, int]) -> dict[str, Any]:
    """The HF ``config.json`` of a random model of the shape ``s`` (FULL or TINY)."""
    layers = s["layers"]
    return {
        "model_type": "qwen3_5_text",
        "vocab_size": s["vocab"],
        "hidden_size": s["hidden"],
        "num_hidden_layers": layers,
        "num_attention_heads": s["heads"],
        "num_key_value_heads": 2,
        "head_dim": s["head_dim"],
        "intermediate_size": s["inter"],
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "layer_types": [
            "full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)
        ],
        "linear_conv_kernel_dim": 4,
        "linear_num_key_heads": s["lin_heads"],
        "linear_num_value_heads": s["lin_heads"],
        "linear_key_head_dim": s["dim"],
        "linear_value_head_dim": s["dim"],
        "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25},
        "eos_token_id": 2,
    }


def make_spec(s: dict[str, int]) -> ModelSpec:
    return ModelSpec.from_config(make_config(s), model_id="gpu-check-random")


def make_weights(spec: ModelSpec, device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Random canonical weights, generated on the device (seeded), with the context-sensitive
    scales of the test checkpoints: greedy output then depends on distant context and varies,
    so a token comparison is not vacuous."""
    g = torch.Generator(device=device).manual_seed(0)
    h = spec.hidden_size

    def normal(*shape: int, mean: float = 0.0, std: float = h**-0.5) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * std + mean).to(dtype)

    w = {"embed_tokens.weight": normal(spec.vocab_size, h, std=0.2), "norm.weight": normal(h)}
    w["lm_head.weight"] = w["embed_tokens.weight"]
    for i in range(spec.num_layers):
        p = f"layers.{i}."
        w[p + "input_layernorm.weight"] = normal(h, std=0.1)
        w[p + "post_attention_layernorm.weight"] = normal(h, std=0.1)
        if i in spec.attention_layers:
            a, kv, d = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
            for n, o in (("q", 2 * a * d), ("k", kv * d), ("v", kv * d)):
                w[p + f"self_attn.{n}_proj.weight"] = normal(o, h)
            w[p + "self_attn.o_proj.weight"] = normal(h, a * d)
            w[p + "self_attn.q_norm.weight"] = normal(d, std=0.1)
            w[p + "self_attn.k_norm.weight"] = normal(d, std=0.1)
        else:
            la, hv = p + "linear_attn.", spec.linear_num_value_heads
            w[la + "in_proj_qkv.weight"] = normal(spec.conv_dim, h)
            w[la + "in_proj_z.weight"] = normal(spec.gdn_value_dim, h)
            w[la + "in_proj_b.weight"] = normal(hv, h)
            w[la + "in_proj_a.weight"] = normal(hv, h)
            w[la + "conv1d.weight"] = normal(spec.conv_dim, spec.conv_kernel, std=0.3)
            a_log = torch.rand(hv, generator=g, device=device) * 0.99 + 0.01
            w[la + "A_log"] = a_log.log()
            w[la + "dt_bias"] = torch.randn(hv, generator=g, device=device) * 0.5 - 2.0
            w[la + "norm.weight"] = normal(spec.linear_value_head_dim, std=0.1)
            w[la + "out_proj.weight"] = normal(h, spec.gdn_value_dim)
        w[p + "mlp.gate_proj.weight"] = normal(spec.intermediate_size, h)
        w[p + "mlp.up_proj.weight"] = normal(spec.intermediate_size, h)
        w[p + "mlp.down_proj.weight"] = normal(h, spec.intermediate_size)
    return w


class Setup:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.spec = make_spec(TINY if args.tiny else FULL)
        self.dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
        self.weights = make_weights(self.spec, args.device, self.dtype)
        self.block, self.chunk = (16, 64) if args.tiny else (64, 256)
        self.max_len = 512 if args.tiny else 4096
        self.max_batch = 8 if args.tiny else 32

    def backend(self, mode: str) -> TorchBackend:
        """mode: eager | buffered (bucketed programs, no capture) | graph (+ deviceResident,
        so the engine pipelines decode) | graph_sync (graphs, ids read before the next step)."""
        static = mode != "eager"
        return TorchBackend(
            self.spec,
            self.weights,
            device=self.args.device,
            dtype=self.dtype,
            cuda_graphs=static,
            traced_prefill=static,
            device_resident=static and mode != "graph_sync",
            max_prefill_chunk=self.chunk,
            max_model_len=self.max_len,
            capture_graphs=mode.startswith("graph"),
        )

    def engine(self, mode: str, *, caching: bool = True) -> tuple[Engine, TorchBackend]:
        be = self.backend(mode)
        per_seq = -(-self.max_len // self.block)
        sc = SchedulerConfig(
            max_batch=self.max_batch,
            max_num_batched_tokens=4 * self.chunk,
            chunk=self.chunk,
            block_size=self.block,
        )
        cfg = EngineConfig(
            scheduler=sc,
            num_kv_blocks=self.max_batch * per_seq + 1,
            num_snapshot_slots=32,
            max_model_len=self.max_len,
            vocab_size=self.spec.vocab_size,
            prefix_caching=caching,
            cache_salt=b"gpu-check",
        )
        return Engine(be, cfg), be

    def prompt(self, n: int, seed: int) -> list[int]:
        r = random.Random(seed)
        return [r.randrange(3, self.spec.vocab_size) for _ in range(n)]


def generate(engine: Engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    rids = [f"r{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
    for rid, p in zip(rids, prompts, strict=True):
        engine.add_request(rid, p, sp)
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finish_reason is not None:
                done[o.request_id] = o.token_ids
    return [done[r] for r in rids]


def ttft(engine: Engine, prompt: list[int]) -> float:
    t = time.perf_counter()
    generate(engine, [prompt], 1)
    return time.perf_counter() - t


def decode_ms(be: TorchBackend, batch: int, ctx: int, steps: int, width: int) -> float:
    """ms per decode step of ``batch`` rows at context ``ctx`` (prefilled once, eagerly)."""
    rows = [
        StepRow(s, (3 + s,) * ctx, 0, tuple(range(1 + s * width, 1 + (s + 1) * width)), s, True)
        for s in range(batch)
    ]
    for r in rows:
        be.execute(StepBatch((r,)))
    toks = [5] * batch
    for n in range(steps + 3):
        if n == 3:
            sync(be)
            t = time.perf_counter()
        batch_rows = tuple(
            StepRow(r.seq_id, (toks[i],), ctx + n, r.block_table, r.state_slot, True)
            for i, r in enumerate(rows)
        )
        toks = [int(x or 0) for x in be.execute(StepBatch(batch_rows)).token_ids]
    sync(be)
    return (time.perf_counter() - t) * 1e3 / steps


def engine_decode(s: Setup, mode: str, n_new: int) -> tuple[list[list[int]], float, int]:
    """(tokens, decode tok/s, pipelined steps): a full batch of short prompts through the
    engine, so the time is decode steps plus the engine's host work between them."""
    eng, be = s.engine(mode, caching=False)
    generate(eng, [s.prompt(16, 500)], 4)  # first use of each bucket, not timed
    prompts = [s.prompt(16, 600 + i) for i in range(s.max_batch)]
    sync(be)
    t = time.perf_counter()
    outs = generate(eng, prompts, n_new)
    sync(be)
    return outs, s.max_batch * n_new / (time.perf_counter() - t), eng.num_pipelined_steps


def sync(be: TorchBackend) -> None:
    if be.device.type == "cuda":
        torch.cuda.synchronize(be.device)


def run(args: argparse.Namespace) -> dict[str, Any]:
    s = Setup(args)
    checks: dict[str, bool] = {}
    res: dict[str, Any] = {}
    n_new = 6 if args.tiny else 32
    lengths = [5, 70, 150] if args.tiny else [7, 300, 1000, 1500, 2100, 2600]
    prompts = [s.prompt(n, 10 + i) for i, n in enumerate(lengths)]
    t0 = time.perf_counter()
    outs: dict[str, list[list[int]]] = {}
    for mode in ("eager", "buffered", "graph"):
        eng, be = s.engine(mode)
        outs[mode] = generate(eng, prompts, n_new)
        if mode == "graph":
            res["graphs_captured"] = be.static.programs.num_captured if be.static else 0
            res["fed_decode_rows"] = be.static.num_fed_rows if be.static else 0
    res["setup_and_equality_s"] = round(time.perf_counter() - t0, 2)
    checks["graph_equals_buffered"] = outs["graph"] == outs["buffered"]
    flat = [
        (a, b)
        for x, y in zip(outs["graph"], outs["eager"], strict=True)
        for a, b in zip(x, y, strict=True)
    ]
    res["graph_vs_eager_token_match"] = round(sum(a == b for a, b in flat) / len(flat), 4)
    res["graph_vs_eager_identical"] = outs["graph"] == outs["eager"]
    res["distinct_tokens"] = len({t for o in outs["graph"] for t in o})
    checks["device_resident_fed"] = res["fed_decode_rows"] > 0

    head = s.prompt(s.max_len // 2, 99)
    warm_eng, _ = s.engine("graph")
    generate(warm_eng, [head + s.prompt(20, 100)], 1)
    target = head + s.prompt(37, 101)
    (warm,) = generate(warm_eng, [target], n_new)
    cold_eng, _ = s.engine("graph", caching=False)
    (cold,) = generate(cold_eng, [target], n_new)
    checks["warm_equals_cold"] = warm == cold
    res["warm_cached_tokens"] = warm_eng.stats().prefix_hits

    width = -(-s.max_len // s.block)
    ctx = 100 if args.tiny else 1024
    for mode in ("eager", "graph"):
        be = s.backend(mode)
        be.allocate(
            num_kv_blocks=s.max_batch * width + 1,
            block_size=s.block,
            num_state_slots=s.max_batch,
            num_snapshot_slots=1,
        )
        for b in sorted({1, 8, s.max_batch}):
            res[f"decode_ms_{mode}_b{b}"] = round(decode_ms(be, b, ctx, args.steps, width), 3)
    # deviceResident pipelining: step n+1 is submitted before step n's ids are read.
    n_dec = args.decode_tokens or (8 if args.tiny else 128)
    piped, piped_tps, piped_steps = engine_decode(s, "graph", n_dec)
    synced, sync_tps, _ = engine_decode(s, "graph_sync", n_dec)
    checks["pipelined_equals_sync"] = piped == synced and piped_steps > 0
    res["engine_decode_tok_s_pipelined"] = round(piped_tps, 1)
    res["engine_decode_tok_s_sync"] = round(sync_tps, 1)
    res["engine_decode_pipelined_over_sync"] = round(piped_tps / sync_tps, 3)
    res["pipelined_steps"] = piped_steps
    reps = 1 if args.tiny else 3
    cold_t, warm_t = [], []
    eng, _ = s.engine("graph")
    ttft(eng, s.prompt(100, 7))  # first-use warm-up, not recorded
    for r in range(reps):
        head = s.prompt(s.max_len * 3 // 4, 200 + r)
        cold_t.append(ttft(eng, head + s.prompt(100, 300 + r)))
        warm_t.append(ttft(eng, head + s.prompt(100, 400 + r)))
    res["ttft_prompt_tokens"] = s.max_len * 3 // 4 + 100
    res["ttft_cold_ms"] = round(statistics.median(cold_t) * 1e3, 2)
    res["ttft_warm_ms"] = round(statistics.median(warm_t) * 1e3, 2)
    res["checks"] = checks
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny model (the CPU dry run)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    ap.add_argument("--steps", type=int, default=None, help="timed decode steps per point")
    ap.add_argument(
        "--decode-tokens",
        type=int,
        default=None,
        help="new tokens per request in the pipelined-vs-synchronous engine timing",
    )
    ap.add_argument("--ledger", default="bench/runs/gpu-check.jsonl")
    args = ap.parse_args()
    return run_and_record(args, "gpu-check", run, default_steps=50)


def run_and_record(
    args: argparse.Namespace,
    name: str,
    run_fn: Callable[[argparse.Namespace], dict[str, Any]],
    default_steps: int,
) -> int:
    """The device scripts' common main: resolve dtype and steps, run, print each check, and
    append one ledger line to ``args.ledger`` (and to ``$OUT/<name>.jsonl`` when the device
    script sets ``OUT``); exit 0 when every check passed."""
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    args.steps = args.steps or (3 if args.tiny else default_steps)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible to torch; use --device cpu --tiny for the dry run")
        return 2
    if args.device == "cpu":
        torch.set_num_threads(1)  # tiny shapes: extra threads only contend
    t0 = time.perf_counter()
    res = run_fn(args)
    for check, ok in res["checks"].items():
        print(f"{'PASS' if ok else 'FAIL'} {check}")
    line = {
        "name": name,
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(args.device) if args.device != "cpu" else "cpu",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "model": "random qwen3_5 tiny" if args.tiny else "random qwen3_5 ~0.75B (0.8B shape)",
        "dtype": args.dtype,
        "total_s": round(time.perf_counter() - t0, 1),
        "git": git_info(),
        "machine": machine_info(),
        "flags": arguments(args),
        **res,
    }
    text = json.dumps(line, sort_keys=True)
    print(text)
    targets = [Path(args.ledger)]
    if os.environ.get("OUT"):
        targets.append(Path(os.environ["OUT"]) / f"{name}.jsonl")
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(text + "\n")
    return 0 if all(res["checks"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
