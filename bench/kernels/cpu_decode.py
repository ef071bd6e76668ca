"""The CPU decode step before and after the AVX2 kernels, side by side in one process.

Two torch backends on one checkpoint (the published Qwen3.5-0.8B shape by default: 24 layers,
vocab 248,320, random weights with the context-sensitive init, written once to a temp folder
in bf16 and loaded in fp32): ``onednn`` runs every projection on oneDNN's packed GEMM and the
LM head's int8 screen on oneDNN's u8·s8 GEMM (what a CPU without AVX512 ran before), ``native``
the defaults (on such a CPU: native.c's projection kernel and its AVX2 screen GEMV). Decode
steps at batch 1 / 8 / 32 after a prompt of ``--ctx`` tokens, and a prefill chunk, alternate
between the two over ``--rounds``; both must pick the same greedy tokens (fp32, exact picks).
One ledger line to ``bench/runs/cpu-decode.jsonl``.

    OMP_NUM_THREADS=2 python -m bench.kernels.cpu_decode [--shape qwen3.5-0.8b] [--model DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common.checkpoint import write_checkpoint
from bench.common.provenance import REPO_ROOT, append_ledger, arguments
from bench.kernels.linear import linear_kernel
from tt_serve.model.interface import StateCopy, StepBatch, StepRow
from tt_serve.model.torch import screen as screen_mod
from tt_serve.model.torch.backend import TorchBackend

LEDGER = REPO_ROOT / "bench" / "runs" / "cpu-decode.jsonl"
BLOCK = 64


def backend(
    path: Path, kernel: str, width: int, batch: int, precision: str | None = None
) -> TorchBackend:
    """A backend with room for ``batch`` sequences of ``width`` blocks; ``precision`` is a
    ``--precision`` profile (None: float32)."""
    with linear_kernel(kernel):
        be = TorchBackend.from_pretrained(path, precision=precision)
    be.allocate(
        num_kv_blocks=batch * width + 1,
        block_size=BLOCK,
        num_state_slots=batch + 1,
        num_snapshot_slots=1,
    )
    return be


def row(seq: int, ids: list[int], start: int, width: int) -> StepRow:
    table = tuple(range(1 + seq * width, 1 + (seq + 1) * width))
    return StepRow(seq, tuple(ids), start, table, seq + 1, sample=True)


class Arm:
    """One backend with ``batch`` sequences prefilled to ``ctx`` tokens, decoding greedily."""

    def __init__(self, be: TorchBackend, kernel: str, ctx: int, width: int) -> None:
        self.be, self.kernel, self.ctx, self.width = be, kernel, ctx, width

    def prefill(self, seqs: int, length: int) -> float:
        """Seconds to prefill ``seqs`` sequences of ``length`` tokens (one chunk each)."""
        self.be.copy_states([StateCopy.reset(s + 1) for s in range(seqs)])  # fresh sequences
        t = time.perf_counter()
        for s in range(seqs):
            ids = [3 + (i * 7 + s * 131) % 4000 for i in range(length)]
            self.be.execute(StepBatch((row(s, ids, 0, self.width),)))
        return time.perf_counter() - t

    def decode(self, batch: int, steps: int) -> tuple[float, list[list[int]]]:
        """Seconds per step over ``steps`` steps of ``batch`` rows, and the tokens."""
        self.prefill(batch, self.ctx)
        toks = [5] * batch
        out: list[list[int]] = []
        t = time.perf_counter()
        for n in range(steps):
            rows = tuple(row(s, [toks[s]], self.ctx + n, self.width) for s in range(batch))
            toks = [int(x or 0) for x in self.be.execute(StepBatch(rows)).token_ids]
            out.append(toks)
        return (time.perf_counter() - t) / steps, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kernels.cpu_decode", description=__doc__)
    ap.add_argument("--shape", default="qwen3.5-0.8b", help="a published model's shape")
    ap.add_argument("--model", type=Path, default=None, help="a checkpoint folder instead")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    width = -(-(max(a.ctx + a.steps, a.prefill) + 1) // BLOCK)
    with tempfile.TemporaryDirectory() as tmp:
        path = a.model
        if path is None:
            from tt_serve.model.published import published_config

            vocab = published_config(a.shape)["text_config"]["vocab_size"]
            layers = published_config(a.shape)["text_config"]["num_hidden_layers"]
            path = write_checkpoint(Path(tmp) / "ckpt", a.shape, layers, vocab, a.seed)
        arms = [
            Arm(backend(path, k, width, max(batches)), k, a.ctx, width) for k in ("onednn", "auto")
        ]
    saved = screen_mod.NATIVE_ROWS
    res: dict[str, dict[str, list[float]]] = {arm.kernel: {} for arm in arms}
    for r in range(a.rounds):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            # the "onednn" arm screens on oneDNN's GEMV too (its C kernel off)
            screen_mod.NATIVE_ROWS = 0 if arm.kernel == "onednn" else saved
            got = res[arm.kernel]
            got.setdefault("prefill_tok_s", []).append(a.prefill / arm.prefill(1, a.prefill))
            for b in batches:
                sec, toks = arm.decode(b, a.steps)
                got.setdefault(f"decode_b{b}_tok_s", []).append(b / sec)
                got.setdefault(f"tokens_b{b}", []).append(hash(str(toks)))
    screen_mod.NATIVE_ROWS = saved
    same = all(
        len(set(res["onednn"][f"tokens_b{b}"] + res["auto"][f"tokens_b{b}"])) == 1 for b in batches
    )
    medians = {
        k: {m: round(statistics.median(v), 2) for m, v in got.items() if not m.startswith("tokens")}
        for k, got in res.items()
    }
    for k, got in medians.items():
        print(k, got)
    ratios = {m: round(medians["auto"][m] / medians["onednn"][m], 3) for m in medians["auto"]}
    print("native / onednn:", ratios, "same greedy tokens:", same)
    append_ledger(
        a.ledger,
        "cpu_decode",
        params={**arguments(a, "model"), "model": a.model.name if a.model else None},
        threads=torch.get_num_threads(),
        kernels=medians,
        native_over_onednn=ratios,
        same_tokens=same,
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
