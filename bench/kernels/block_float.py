"""CPU decode and prefill in each weight precision profile, side by side in one process, as a
fraction of the memory's read bandwidth; optionally beside llama.cpp's quantized GGUFs.

One torch backend per profile on one checkpoint (the published Qwen3.5-0.8B shape by default:
24 layers, vocab 248,320, random weights with the context-sensitive init, written once to a temp
folder): ``float32`` (the checkpoint's weights, today's default), ``bfloat16``, ``mixed``
(bfloat8_b projections and LM head) and ``bfp4-mlp`` (MLP bfloat4_b), the block floats held
packed and decoded in native.c's ``tt_bfp_linear``. Decode steps at batch 1 / 8 / 32 after a
prompt of ``--ctx`` tokens, and one ``--prefill``-token prefill, alternate between the profiles
over ``--rounds``. Bytes per token are what a batch-1 decode step reads of the weights (every
projection as held, the LM head's read: its int8 screen in fp32, its packed codes in a profile);
the bandwidth is a 2-thread sum over 1 GiB (``torch.sum``, the best of five), so
``bytes/token x tokens/s / bandwidth`` is the fraction of the limit reached.

With ``--llama-bench PATH --gguf NAME=FILE ...`` it also runs llama.cpp's ``llama-bench`` on
each GGUF (``-t`` threads, tg ``--steps`` at depth ``--ctx``, pp ``--prefill``), e.g. the
Q8_0 and Q4_K_M quantizations of the same checkpoint (docs/benchmarks.md has the commands).
One ledger line to ``bench/runs/block-float.jsonl``.

    OMP_NUM_THREADS=2 python -m bench.kernels.block_float [--shape qwen3.5-0.8b] [--model DIR]
        [--llama-bench llama-bench --gguf q8_0=m-q8_0.gguf q4_k_m=m-q4_k_m.gguf]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.common.checkpoint import write_checkpoint
from bench.common.provenance import REPO_ROOT, append_ledger, arguments
from bench.kernels.cpu_decode import BLOCK, Arm, backend
from tt_serve.model.torch.footprint import held_read
from tt_serve.model.torch.model import HybridModel

LEDGER = REPO_ROOT / "bench" / "runs" / "block-float.jsonl"
PROFILES = ("float32", "bfloat16", "mixed", "bfp4-mlp")


def read_bandwidth_gbs(gib: float = 1.0, tries: int = 5) -> float:
    """GB/s of a threaded sum over ``gib`` GiB of fp32 (the best of ``tries``)."""
    x = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        torch.sum(x)
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def decode_bytes(model: HybridModel) -> int:
    """Weight bytes one batch-1 decode step reads (projections as held, the head's read)."""
    return held_read(model).total


def llama_bench(exe: str, gguf: Path, a: argparse.Namespace) -> dict[str, float]:
    """llama-bench's tokens/s for generation at depth ``ctx`` and for a ``prefill`` prompt."""
    cmd = [exe, "-m", str(gguf), "-t", str(a.threads), "-r", str(a.rounds), "-o", "json"]
    cmd += ["-p", str(a.prefill), "-n", str(a.steps), "-d", str(a.ctx)]
    runs = json.loads(subprocess.run(cmd, capture_output=True, check=True, text=True).stdout)
    out: dict[str, float] = {}
    for r in runs:
        key = "decode_b1_tok_s" if int(r.get("n_gen", 0)) else "prefill_tok_s"
        out[key] = round(float(r["avg_ts"]), 2)
    out["gguf_bytes"] = gguf.stat().st_size
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kernels.block_float", description=__doc__)
    ap.add_argument("--shape", default="qwen3.5-0.8b", help="a published model's shape")
    ap.add_argument("--model", type=Path, default=None, help="a checkpoint folder instead")
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--llama-bench", default=None, help="llama.cpp's llama-bench binary")
    ap.add_argument("--gguf", nargs="*", default=[], help="NAME=FILE GGUFs for llama-bench")
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    profiles = a.profiles.split(",")
    batches = [int(b) for b in a.batches.split(",")]
    width = -(-(max(a.ctx + a.steps, a.prefill) + 1) // BLOCK)
    with tempfile.TemporaryDirectory() as tmp:
        path = a.model
        if path is None:
            from tt_serve.model.published import published_config

            text = published_config(a.shape)["text_config"]
            path = write_checkpoint(
                Path(tmp) / "ckpt", a.shape, text["num_hidden_layers"], text["vocab_size"], a.seed
            )
        loaded: dict[str, float] = {}
        arms: list[Arm] = []
        for p in profiles:
            t = time.perf_counter()
            precision = None if p == "float32" else p
            be = backend(path, "auto", width, max(batches), precision)
            arms.append(Arm(be, p, a.ctx, width))
            loaded[p] = round(time.perf_counter() - t, 1)
    bandwidth = read_bandwidth_gbs()
    res: dict[str, dict[str, list[float]]] = {arm.kernel: {} for arm in arms}
    tokens: dict[str, list[list[int]]] = {}
    for r in range(a.rounds):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            got = res[arm.kernel]
            got.setdefault("prefill_tok_s", []).append(a.prefill / arm.prefill(1, a.prefill))
            for b in batches:
                sec, toks = arm.decode(b, a.steps)
                got.setdefault(f"decode_b{b}_tok_s", []).append(b / sec)
                tokens[arm.kernel] = toks
    report: dict[str, dict[str, Any]] = {}
    for arm in arms:
        med = {m: round(statistics.median(v), 2) for m, v in res[arm.kernel].items()}
        per_token = decode_bytes(arm.be.model)
        med["bytes_per_token"] = per_token
        med["bandwidth_fraction_b1"] = round(
            per_token * med["decode_b1_tok_s"] / 1e9 / bandwidth, 3
        )
        med["load_s"] = loaded[arm.kernel]
        report[arm.kernel] = med
        print(arm.kernel, med, flush=True)
    peers: dict[str, dict[str, float]] = {}
    if a.llama_bench:
        for spec in a.gguf:
            name, _, file = spec.partition("=")
            peers[name] = llama_bench(a.llama_bench, Path(file), a)
            peers[name]["bandwidth_fraction_b1"] = round(
                peers[name]["gguf_bytes"] * peers[name]["decode_b1_tok_s"] / 1e9 / bandwidth, 3
            )
            print("llama.cpp", name, peers[name], flush=True)
    base = report.get("float32")
    ratios = {
        p: {m: round(v / base[m], 3) for m, v in r.items() if m.endswith("tok_s")}
        for p, r in report.items()
        if base
    }
    print("over float32:", ratios, f"read bandwidth {bandwidth:.1f} GB/s")
    append_ledger(
        a.ledger,
        "block_float",
        params={**arguments(a, "model", "gguf"), "model": a.model.name if a.model else None},
        threads=a.threads,
        read_bandwidth_gbs=round(bandwidth, 2),
        profiles=report,
        over_float32=ratios,
        llama_cpp=peers,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
