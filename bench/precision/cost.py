"""What each ttnn precision profile costs in output quality, against the float32 reference.

A random-weight checkpoint at a published model's layer shapes (``--shape``, first ``--layers``
layers in the release pattern, context-sensitive init, saved in bf16 as release checkpoints are)
runs on the torch reference backend (float32) and, per profile (``bfloat16``, ``mixed``,
``bfp4-mlp``), on the ttnn backend over the virtual device with ``card_formats`` on: every stored
value is rounded to its dtype as the card stores it (bf16 activations and KV, block-float
weights, ``tt_serve/model/formats.py``); ops compute in float32, so math fidelity and bf16
accumulation are not in these numbers (``README`` "Precision profiles"). A ``float32`` row
(the ``mixed`` build with ``card_formats`` off) is the method's own floor.

Prompts: the tails of the agent replay's first-turn prompts (``bench/agent_replay``, real Qwen
tokenizer). Per prompt the reference decodes greedily; every profile then
- decodes greedily on its own: whole continuations equal to the reference's and to the
  ``bfloat16`` profile's, and the mean agreeing prefix (fraction of steps);
- runs teacher-forced over prompt + the reference's tokens (prefill, then one decode step per
  reference token, logits every step): top-1 / top-5 agreement with the reference token per
  position, and |Δ logprob| of that token (mean, p99, max).

    OMP_NUM_THREADS=1 python -m bench.precision.cost --shape qwen3.5-0.8b --layers 4
    python -m bench.precision.cost ... --write-table   # also refresh the planner's table
    python -m bench.precision.cost --table-from bench/runs/precision-cost.jsonl --layers 4

One ledger line to ``bench/runs/precision-cost.jsonl``; ``--write-table`` merges the shape's
numbers into ``tt_serve/model/precision_cost.json`` (what ``tt-serve plan`` shows).
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common.checkpoint import write_checkpoint
from bench.common.provenance import REPO_ROOT, append_ledger
from tt_serve.model.interface import Backend, StateCopy, StepBatch, StepRow
from tt_serve.model.precision import PROFILES
from tt_serve.model.published import published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.options import TTOptions
from tt_serve.model.tt.plan.cost_table import TABLE_PATH, merge_shape
from tt_serve.model.tt.runtime.build import build_backend
from tt_serve.model.tt.virtual.device import VirtualTTNN
from tt_serve.model.weights import load_weights

LEDGER = REPO_ROOT / "bench" / "runs" / "precision-cost.jsonl"
BLOCK, CHUNK = 64, 128


def agent_prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    """The last ``length`` tokens of the agent replay's first-turn prompts of ``n`` agents (each
    ends in that agent's own task and the generation prompt); ids >= ``vocab`` fold into it."""
    from bench.agent_replay.workload import Sizes, build
    from tt_serve.qwen_vocab import write_tokenizer
    from tt_serve.tokenizer import load_tokenizer

    with tempfile.TemporaryDirectory() as d:
        write_tokenizer(Path(d))
        tok = load_tokenizer(d)
        assert tok is not None
        wl = build(Sizes(agents=n, turns=2, head=64, task=length), seed=0, tok=tok)
        ids = [wl.conversation(a, "verbatim").prompt_ids(tok) for a in range(n)]
    return [[t % vocab for t in p[-length:]] for p in ids]


def run(
    be: Backend, prompt: list[int], steps: int, forced: list[int] | None
) -> tuple[list[int], np.ndarray]:
    """Prefill ``prompt`` then decode ``steps`` tokens: the argmax each time, or ``forced``'s.
    Returns the tokens taken and the log-softmax of every step's logits [steps, vocab]."""
    be.copy_states([StateCopy.reset(0)])
    table = tuple(range(1, 2 + (len(prompt) + steps) // BLOCK))
    logits = None
    for s in range(0, len(prompt), CHUNK):
        part = tuple(prompt[s : s + CHUNK])
        last = s + CHUNK >= len(prompt)
        out = be.execute(StepBatch((StepRow(1, part, s, table, 0, last, last),)))
        logits = out.logits[0] if last else None
    toks: list[int] = []
    lps = []
    for k in range(steps):
        assert logits is not None
        lp = torch.log_softmax(torch.from_numpy(np.asarray(logits, np.float32)), -1).numpy()
        lps.append(lp)
        toks.append(int(np.argmax(lp)) if forced is None else forced[k])
        if k + 1 < steps:
            row = StepRow(1, (toks[-1],), len(prompt) + k, table, 0, True, True)
            logits = be.execute(StepBatch((row,))).logits[0]
    return toks, np.stack(lps)


def tt_backend(path: Path, profile: str, card_formats: bool) -> Backend:
    ops = Ops(VirtualTTNN(card_formats=card_formats, require_sdpa_program_config=True))
    ops.open_device(0, trace_region_size=64 << 20, l1_small_size=0)
    spec = ModelSpec.from_hf_dir(path)
    options = TTOptions(precision=profile, prefill_chunk=CHUNK, traced_prefill=False)
    # the checkpoint is bf16: loading it as bf16 keeps its values and halves the host copy
    be = build_backend(
        spec,
        load_weights(path, spec, dtype="bfloat16"),
        ops=ops,
        options=options,
        tp=TensorParallel(spec, 1),
    )
    return _allocated(be)


def _allocated(be: Backend) -> Backend:
    be.allocate(num_kv_blocks=16, block_size=BLOCK, num_state_slots=1, num_snapshot_slots=1)
    return be


def measure(
    make: Callable[[], Backend],
    prompts: list[list[int]],
    ref: list[dict[str, Any]],
    steps: int,
    bf16_tokens: list[list[int]] | None,
) -> dict[str, Any]:
    be = make()
    top1, top5, drift, same_ref, same_bf16, prefix = [], [], [], 0, 0, []
    free_tokens = []
    for p, r in zip(prompts, ref, strict=True):
        free, _ = run(be, p, steps, None)
        free_tokens.append(free)
        same_ref += free == r["tokens"]
        same_bf16 += bf16_tokens is not None and free == bf16_tokens[len(free_tokens) - 1]
        n = next(
            (i for i, (a, b) in enumerate(zip(free, r["tokens"], strict=True)) if a != b), steps
        )
        prefix.append(n / steps)
        _, lp = run(be, p, steps, r["tokens"])
        want = np.asarray(r["tokens"])
        rows = np.arange(steps)
        top1 += (lp.argmax(-1) == want).tolist()
        top5 += (np.argsort(-lp, -1)[:, :5] == want[:, None]).any(-1).tolist()
        drift += np.abs(lp[rows, want] - r["logprobs"][rows, want]).tolist()
    d = np.asarray(drift)
    # the virtual device's tensors and their owner form cycles: free this backend before the
    # next one is built (two 9B-width backends at once do not fit the machine)
    del be
    gc.collect()
    return {
        "greedy_equal_reference": same_ref / len(prompts),
        "greedy_equal_bfloat16": same_bf16 / len(prompts) if bf16_tokens is not None else None,
        "greedy_agreeing_prefix": float(np.mean(prefix)),
        "top1": float(np.mean(top1)),
        "top5": float(np.mean(top5)),
        "logprob_drift": {
            "mean": float(d.mean()),
            "p99": float(np.quantile(d, 0.99)),
            "max": float(d.max()),
        },
        "tokens": free_tokens,
    }


def write_table(line: dict[str, Any]) -> None:
    """Merge one ledger line's shape into the planner's table, with its provenance."""
    git = line["git"]
    prov = line["run"] | {"commit": git["commit"], "dirty": git["dirty"]}
    merge_shape(TABLE_PATH, line["run"]["shape"], prov, {p: line["results"][p] for p in PROFILES})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.precision.cost", description=__doc__)
    ap.add_argument("--shape", default="qwen3.5-0.8b", help="a published model's name")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=0, help="embedding/head rows (0: the model's)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    ap.add_argument("--write-table", action="store_true", help="also merge into the table")
    ap.add_argument(
        "--table-from", type=Path, default=None, help="only rewrite the table from a ledger"
    )
    a = ap.parse_args(argv)
    if a.table_from:  # the newest line of each shape measured with --layers
        lines = [json.loads(s) for s in a.table_from.read_text().splitlines() if s.strip()]
        lines = [ln for ln in lines if ln["run"]["layers"] == a.layers]
        for line in {ln["run"]["shape"]: ln for ln in lines}.values():
            write_table(line)
        return 0
    vocab = a.vocab or published_config(a.shape)["text_config"]["vocab_size"]
    prompts = agent_prompts(a.prompts, a.prompt_len, vocab)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        path = write_checkpoint(Path(d) / "ckpt", a.shape, a.layers, vocab, a.seed)
        ref_be = _allocated(TorchBackend.from_pretrained(path))
        ref: list[dict[str, Any]] = []
        for p in prompts:
            toks, lps = run(ref_be, p, a.steps, None)
            ref.append({"tokens": toks, "logprobs": lps})
        del ref_be
        gc.collect()
        distinct = len({t for r in ref for t in r["tokens"]})
        results: dict[str, Any] = {}
        for profile in PROFILES:
            bf16 = results["bfloat16"]["tokens"] if "bfloat16" in results else None
            results[profile] = measure(
                partial(tt_backend, path, profile, True), prompts, ref, a.steps, bf16
            )
            print(
                profile,
                json.dumps({k: v for k, v in results[profile].items() if k != "tokens"}),
                flush=True,
            )
        bf16 = results["bfloat16"]["tokens"]
        results["float32"] = measure(
            partial(tt_backend, path, "mixed", False), prompts, ref, a.steps, bf16
        )
    for r in results.values():
        r.pop("tokens")
    hidden = published_config(a.shape)["text_config"]["hidden_size"]
    run_info = {
        "shape": a.shape,
        "hidden": hidden,
        "layers": a.layers,
        "vocab": vocab,
        "prompts": a.prompts,
        "prompt_len": a.prompt_len,
        "steps": a.steps,
        "positions": a.prompts * a.steps,
        "reference_distinct_tokens": distinct,
        "seconds": time.perf_counter() - t0,
    }
    print(json.dumps(run_info | {"profiles": results}, indent=1))
    params = {k: str(v) for k, v in vars(a).items() if k not in ("ledger", "table_from")}
    line = append_ledger(a.ledger, "precision_cost", params=params, results=results, run=run_info)
    if a.write_table:
        write_table(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
