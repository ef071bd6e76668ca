"""What a lower CPU precision costs: the torch backend in bfloat16 against float32, side by side.

On a fixed, seeded prompt set the float32 backend decodes greedily; both backends then run
teacher-forced over the same prompt + float32 tokens (``execute_all_logits``, one eager pass),
so every position compares the two distributions on identical inputs:
- greedy agreement: the fraction of positions whose argmax is the float32 token, and the
  fraction of sequences whose whole greedy continuation (run freely in bfloat16) is the same;
- logprob drift: |logprob_bf16 - logprob_fp32| of the float32 token (mean, p99, max);
- speed: batch-1 decode tok/s and 2048-token prefill tok/s of each dtype, interleaved.
One ledger line to ``bench/runs/precision-drift.jsonl``. The demo model by default (random
weights: its distributions are flatter than a trained model's, so agreement is a lower bound).

    OMP_NUM_THREADS=2 python -m bench.precision.drift [--model DIR] [--prompts 16]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common.provenance import REPO_ROOT, append_ledger
from tt_serve.demo import ensure_demo_model
from tt_serve.model.interface import StateCopy, StepBatch, StepRow
from tt_serve.model.torch.backend import TorchBackend

LEDGER = REPO_ROOT / "bench" / "runs" / "precision-drift.jsonl"
BLOCK = 64


def _backend(path: Path, dtype: str) -> TorchBackend:
    be = TorchBackend.from_pretrained(path, dtype=dtype)
    be.allocate(num_kv_blocks=256, block_size=BLOCK, num_state_slots=2, num_snapshot_slots=1)
    return be


def _table(n: int) -> tuple[int, ...]:
    return tuple(range(1, 1 + -(-n // BLOCK)))


def greedy(be: TorchBackend, prompt: list[int], steps: int) -> list[int]:
    be.copy_states([StateCopy.reset(0)])
    table = _table(len(prompt) + steps)
    out = be.execute(StepBatch((StepRow(1, tuple(prompt), 0, table, 0, True),)))
    toks = [int(out.token_ids[0] or 0)]
    for k in range(steps - 1):
        row = StepRow(1, (toks[-1],), len(prompt) + k, table, 0, True)
        toks.append(int(be.execute(StepBatch((row,))).token_ids[0] or 0))
    return toks


def forced_logprobs(be: TorchBackend, ids: list[int]) -> torch.Tensor:
    """log-softmax at every position of ``ids`` (one eager pass), float32 [len, vocab]."""
    be.copy_states([StateCopy.reset(0)])
    row = StepRow(1, tuple(ids), 0, _table(len(ids)), 0, False)
    logits = be.execute_all_logits(StepBatch((row,)))[0]
    return torch.log_softmax(logits.float(), dim=-1)


def decode_speed(be: TorchBackend, prompt: list[int], steps: int) -> float:
    t = time.perf_counter()
    greedy(be, prompt, steps)
    return steps / (time.perf_counter() - t)


def prefill_speed(be: TorchBackend, ids: list[int]) -> float:
    be.copy_states([StateCopy.reset(0)])
    row = StepRow(1, tuple(ids), 0, _table(len(ids)), 0, True)
    t = time.perf_counter()
    be.execute(StepBatch((row,)))
    return len(ids) / (time.perf_counter() - t)


def prompt_args(ap: argparse.ArgumentParser, prompts: int, ledger: Path) -> None:
    """The arguments of a seeded prompt set decoded ``--steps`` greedily, and the ledger."""
    ap.add_argument("--prompts", type=int, default=prompts)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ledger", type=Path, default=ledger)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.precision.drift", description=__doc__)
    ap.add_argument("--model", type=Path, default=None, help="checkpoint folder (demo model)")
    prompt_args(ap, 16, LEDGER)
    a = ap.parse_args(argv)
    path = a.model or ensure_demo_model(log=lambda s: None)
    fp32, bf16 = _backend(path, "float32"), _backend(path, "bfloat16")
    vocab = fp32.spec.vocab_size
    rng = np.random.default_rng(a.seed)
    prompts = [
        rng.integers(100, min(vocab, 200000), a.prompt_len).tolist() for _ in range(a.prompts)
    ]
    agree, same_seq, drift = [], 0, []
    for prompt in prompts:
        ref = greedy(fp32, prompt, a.steps)
        same_seq += greedy(bf16, prompt, a.steps) == ref
        ids = prompt + ref
        lp32, lp16 = forced_logprobs(fp32, ids), forced_logprobs(bf16, ids)
        # position p predicts ids[p + 1]: compare on the generated part only
        pos = torch.arange(len(prompt) - 1, len(ids) - 1)
        nxt = torch.tensor(ids[len(prompt) :])
        agree += (lp16[pos].argmax(-1) == nxt).tolist()
        drift += (lp16[pos, nxt] - lp32[pos, nxt]).abs().tolist()
    speed: dict[str, dict[str, list[float]]] = {"float32": {}, "bfloat16": {}}
    long_prompt = rng.integers(100, min(vocab, 200000), 2048).tolist()
    for r in range(2):
        for name, be in (("float32", fp32), ("bfloat16", bf16))[:: 1 if r % 2 == 0 else -1]:
            speed[name].setdefault("decode_tok_s", []).append(decode_speed(be, prompts[0], 64))
            speed[name].setdefault("prefill_2048_tok_s", []).append(prefill_speed(be, long_prompt))
    d = np.asarray(drift)
    results: dict[str, Any] = {
        "greedy_agreement_per_position": float(np.mean(agree)),
        "free_running_sequences_equal": same_seq / len(prompts),
        "logprob_drift": {
            "mean": float(d.mean()),
            "p99": float(np.quantile(d, 0.99)),
            "max": float(d.max()),
        },
        "speed": {k: {m: float(np.median(v)) for m, v in s.items()} for k, s in speed.items()},
    }
    print(json.dumps(results, indent=1))
    params = {k: str(v) for k, v in vars(a).items() if k != "ledger"} | {"model": path.name}
    append_ledger(a.ledger, "precision_drift", params=params, results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
