"""tt-serve beside HF transformers on one CUDA device, the same random checkpoint, one process.

Usage: python -m bench.gpu.side_by_side [--device cuda] [--tiny] [--skip-hf] [--ledger PATH]

The model is ``bench/gpu/check.py``'s random Qwen3.5-0.8B shape (752 M parameters, bf16),
built in memory: no checkpoint, no safetensors. tt-serve runs as a GPU user starts it (the
defaults on CUDA: graphed decode, device residency, graphed prefill, decode buckets up to the
batch); HF transformers runs the same weights (its Qwen3.5 model uses flash-linear-attention's
GDN kernels when ``fla`` imports; the ledger says whether it did). Measured, each figure the
median of repeats:

* the bandwidth limit: a device-to-device copy of 1 GiB (read + write bytes / s), and the decode
  step it bounds: the weights read once;
* decode ms per step and tok/s at batch 1 / 8 / 32 / 64 (context 1,024), both;
* prefill of a 4,096-token prompt: tt-serve through its engine (graphed 256-token chunks, the
  cache off), HF as one forward;
* kernels per decode step at batch 1 (torch.profiler's CUDA kernels over 5 steps / 5; on the
  CPU dry run, aten ops);
* the agents' workload: 8 agents, each a shared 31,000-token head + its own 1,000-token tail,
  16 new tokens: the first burst with the cache off and on, then turn 2 (each prompt + answer +
  250 tokens, cache on); warm turn-2 answers equal a cold run of the same prompts.

One JSON line to ``--ledger`` (default bench/runs/gpu-side-by-side.jsonl) and to
``$OUT/gpu-side-by-side.jsonl`` when ``$OUT`` is set. ``--device cpu --tiny`` is the dry run
(a test runs it); on a GPU the whole run takes about 3-5 minutes (fla's first call compiles its
Triton kernels, 30-50 s, before the timed calls).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.gpu.check import (
    FULL,
    TINY,
    Setup,
    decode_ms,
    generate,
    make_config,
    run_and_record,
    sync,
)
from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.model.interface import StepBatch, StepRow
from tt_serve.model.torch.backend import TorchBackend

BATCHES = (1, 8, 32, 64)


def _median_s(fn: Callable[[], None], sync_fn: Callable[[], None], reps: int) -> float:
    times = []
    for _ in range(reps):
        sync_fn()
        t = time.perf_counter()
        fn()
        sync_fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Bytes moved (read + write) per second by a device-to-device copy of ``nbytes``."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    dev = torch.device(device)
    sec = _median_s(lambda: dst.copy_(src), lambda: _sync(dev), 5)
    return 2 * src.numel() * src.element_size() / sec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Ours:
    """tt-serve's torch backend as ``serve --device cuda`` starts it (graphs, residency,
    graphed prefill; on the CPU dry run, the same bucketed programs eagerly)."""

    def __init__(self, setup: Setup, max_batch: int) -> None:
        self.s = setup
        self.max_batch = max_batch

    def backend(self, max_len: int | None = None) -> TorchBackend:
        """``max_len``: the context the graphs' tables reach (default: the setup's)."""
        s = self.s
        return TorchBackend(
            s.spec,
            s.weights,
            device=s.args.device,
            dtype=s.dtype,
            cuda_graphs=True,
            traced_prefill=True,
            device_resident=True,
            max_prefill_chunk=s.chunk,
            max_model_len=max_len or s.max_len,
            capture_graphs=s.args.device.startswith("cuda"),
        )

    def engine(self, *, caching: bool, max_len: int, agents: int) -> tuple[Engine, TorchBackend]:
        s, be = self.s, self.backend(max_len)
        per_seq = -(-max_len // s.block)
        sc = SchedulerConfig(
            max_batch=max(agents, 1),
            max_num_batched_tokens=4 * s.chunk,
            chunk=s.chunk,
            block_size=s.block,
        )
        cfg = EngineConfig(
            scheduler=sc,
            num_kv_blocks=(agents + 1) * per_seq + 1,
            num_snapshot_slots=32,
            max_model_len=max_len,
            vocab_size=s.spec.vocab_size,
            prefix_caching=caching,
            cache_salt=b"gpu-side-by-side",
        )
        return Engine(be, cfg), be

    def decode(self, ctx: int, steps: int) -> dict[int, float]:
        s = self.s
        width = -(-(ctx + steps + 8) // s.block)
        be = self.backend()
        be.allocate(
            num_kv_blocks=self.max_batch * width + 1,
            block_size=s.block,
            num_state_slots=self.max_batch,
            num_snapshot_slots=1,
        )
        return {b: decode_ms(be, b, ctx, steps, width) for b in BATCHES if b <= self.max_batch}

    def kernels_per_step(self, ctx: int) -> tuple[float, str]:
        """Device kernels (CPU: aten ops) of one graphed decode step at batch 1."""
        s = self.s
        width = -(-(ctx + 16) // s.block)
        be = self.backend()
        be.allocate(
            num_kv_blocks=width + 1, block_size=s.block, num_state_slots=1, num_snapshot_slots=1
        )
        decode_ms(be, 1, ctx, 3, width)  # prefill the row and warm the bucket
        step = StepBatch((StepRow(0, (5,), ctx, tuple(range(1, 1 + width)), 0, True),))
        return count_kernels(lambda: [be.execute(step) for _ in range(5)], 5, be.device)

    def prefill_s(self, tokens: int) -> float:
        eng, be = self.engine(caching=False, max_len=tokens + 64, agents=1)
        generate(eng, [self.s.prompt(self.s.chunk, 1)], 1)  # capture + first use, not timed
        prompt = self.s.prompt(tokens, 2)
        return _median_s(lambda: generate(eng, [prompt], 1), lambda: sync(be), 3)


def count_kernels(fn: Callable[[], Any], steps: int, device: torch.device) -> tuple[float, str]:
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        fn()
        _sync(device)
    if cuda:
        n = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        return n / steps, "cuda kernels"
    n = sum(1 for e in prof.events() if e.name.startswith("aten::"))
    return n / steps, "aten ops (cpu dry run)"


def hf_model(setup: Setup, shape: dict[str, int]) -> tuple[Any, bool]:
    """HF transformers' model of the same config and weights, and whether fla imports."""
    import transformers

    cfg = dict(make_config(shape))
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=setup.dtype)
    model = model.to(setup.args.device).eval()
    want = model.state_dict()
    state = {}
    for k, v in setup.weights.items():
        name = k if k == "lm_head.weight" else "model." + k
        # the canonical layout squeezes HF's conv1d weight [C, 1, K] to [C, K]
        state[name] = v.reshape(want[name].shape) if name in want else v
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("lm_head.weight")]  # tied
    if missing or unexpected:
        raise RuntimeError(f"HF weights do not line up: missing {missing}, unexpected {unexpected}")
    try:
        import fla  # noqa: F401

        has_fla = True
    except ImportError:
        has_fla = False
    return model, has_fla


def hf_decode_ms(model: Any, batch: int, ctx: int, steps: int, vocab: int) -> float:
    device = next(model.parameters()).device
    ids = torch.tensor([[3 + (i * 7 + s) % (vocab - 3) for i in range(ctx)] for s in range(batch)])
    with torch.no_grad():
        out = model(ids.to(device), use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for n in range(steps + 3):
            if n == 3:
                _sync(device)
                t = time.perf_counter()
            out = model(tok, past_key_values=cache, use_cache=True)
            cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        _sync(device)
    return (time.perf_counter() - t) * 1e3 / steps


def hf_prefill_s(model: Any, tokens: int, vocab: int) -> float:
    device = next(model.parameters()).device
    ids = torch.tensor([[3 + (i * 13) % (vocab - 3) for i in range(tokens)]], device=device)

    def run() -> None:
        with torch.no_grad():
            model(ids, use_cache=False, logits_to_keep=1)

    run()  # first call (fla compiles its kernels here)
    return _median_s(run, lambda: _sync(device), 3)


def agents(ours: Ours, head_len: int, tail_len: int, more: int, n_new: int) -> dict[str, Any]:
    """8 agents on a shared head: first burst cache off / on, then turn 2 (cache on), and turn
    2's answers against a cold engine's."""
    s, n = ours.s, 8
    head = s.prompt(head_len, 31)
    firsts = [head + s.prompt(tail_len, 40 + i) for i in range(n)]
    max_len = head_len + tail_len + n_new + more + n_new + 64
    out: dict[str, Any] = {"agents": n, "head": head_len, "tail": tail_len, "turn2_added": more}
    for caching in (False, True):
        eng, be = ours.engine(caching=caching, max_len=max_len, agents=n)
        generate(eng, [s.prompt(s.chunk + 5, 3)], 2)  # captures and first use, not timed
        sync(be)
        t = time.perf_counter()
        answers = generate(eng, firsts, n_new)
        sync(be)
        out[f"first_burst_s_cache_{'on' if caching else 'off'}"] = round(time.perf_counter() - t, 3)
    seconds = [
        f + a + s.prompt(more, 60 + i) for i, (f, a) in enumerate(zip(firsts, answers, strict=True))
    ]
    hits_before = eng.stats().prefix_hits
    t = time.perf_counter()
    warm = generate(eng, seconds, n_new)
    sync(be)
    out["turn2_s"] = round(time.perf_counter() - t, 3)
    assert be.static is not None
    out["bucketed_runs"] = sum(be.static.programs.runs.values())  # graphs, not the eager path
    out["turn2_cached_tokens"] = eng.stats().prefix_hits - hits_before
    out["turn2_prompt_tokens"] = sum(len(p) for p in seconds)
    # what turn 1 left to resume from: each agent's prompt + answer, down to a chunk boundary
    # (these prompts are token ids, cut at chunk multiples only)
    out["turn2_resumable_tokens"] = sum(
        (len(f) + len(a)) // s.chunk * s.chunk for f, a in zip(firsts, answers, strict=True)
    )
    cold_eng, _ = ours.engine(caching=False, max_len=max_len, agents=n)
    out["turn2_warm_equals_cold"] = warm == generate(cold_eng, seconds, n_new)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    shape = TINY if args.tiny else FULL
    setup = Setup(args)
    setup.max_len = 4096 + 64 if not args.tiny else 512
    ctx = 64 if args.tiny else 1024
    steps = args.steps
    res: dict[str, Any] = {}
    weight_bytes = sum(w.numel() * w.element_size() for w in setup.weights.values())
    weight_bytes -= setup.weights["lm_head.weight"].numel() * setup.dtype.itemsize  # tied
    bw = copy_bandwidth(args.device, (64 << 20) if args.tiny else (1 << 30))
    res["weight_bytes"] = weight_bytes
    res["copy_gb_s"] = round(bw / 1e9, 1)
    res["decode_limit_ms_b1"] = round(weight_bytes / bw * 1e3, 3)
    ours = Ours(setup, max_batch=16 if args.tiny else 64)
    t0 = time.perf_counter()
    for b, ms in ours.decode(ctx, steps).items():
        res[f"ours_decode_ms_b{b}"] = round(ms, 3)
        res[f"ours_decode_tok_s_b{b}"] = round(b * 1e3 / ms, 1)
    res["ours_decode_s"] = round(time.perf_counter() - t0, 1)
    kernels, what = ours.kernels_per_step(ctx)
    res["ours_kernels_per_decode_step_b1"], res["kernels_counted"] = round(kernels, 1), what
    prefill_tokens = 256 if args.tiny else 4096
    res["prefill_tokens"] = prefill_tokens
    res["ours_prefill_ms"] = round(ours.prefill_s(prefill_tokens) * 1e3, 2)
    if not args.skip_hf:
        model, has_fla = hf_model(setup, shape)
        res["hf_fla"] = has_fla
        res["hf_prefill_ms"] = round(
            hf_prefill_s(model, prefill_tokens, setup.spec.vocab_size) * 1e3, 2
        )
        for b in BATCHES if not args.tiny else (1, 8):
            ms = hf_decode_ms(model, b, ctx, steps, setup.spec.vocab_size)
            res[f"hf_decode_ms_b{b}"] = round(ms, 3)
            res[f"hf_decode_tok_s_b{b}"] = round(b * 1e3 / ms, 1)
        del model
    sizes = (300, 30, 25, 4) if args.tiny else (31000, 1000, 250, 16)
    res["agents"] = agents(ours, *sizes)
    res["checks"] = {
        "turn2_warm_equals_cold": res["agents"]["turn2_warm_equals_cold"],
        "turn2_resumes_its_history": res["agents"]["turn2_cached_tokens"]
        >= res["agents"]["turn2_resumable_tokens"],
        "agents_ran_bucketed": res["agents"]["bucketed_runs"] > 0,
    }
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny model (the CPU dry run)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    ap.add_argument("--steps", type=int, default=None, help="timed decode steps per point")
    ap.add_argument("--skip-hf", action="store_true", help="tt-serve only (no transformers)")
    ap.add_argument("--ledger", default="bench/runs/gpu-side-by-side.jsonl")
    args = ap.parse_args()
    return run_and_record(args, "gpu-side-by-side", run, default_steps=30)


if __name__ == "__main__":
    raise SystemExit(main())
