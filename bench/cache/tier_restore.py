"""What a restore from the host or disk tier costs, against recomputing the history.

For each context length: one conversation's prompt is prefilled on an engine whose device pool
holds one conversation and two snapshots, three others push it out of the pool, then the same
prompt plus a short new message comes back. Measured per tier (host; disk on a fresh engine, as
after a restart), in the same run:

* the restore: ``TierStats.restore_seconds`` (fetch from the tier, checks, device write) and the
  bytes written; the unit's bytes (``ModelSpec.resume_unit_bytes``);
* the warm request's time to first token against the same request on a tierless engine (the
  history recomputed), and whether the tokens are equal (they must be).

One line per run to ``bench/runs/tier-restore.jsonl``.

    OMP_NUM_THREADS=2 python -m bench.cache.tier_restore [--tokens 1024,4096,8192]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common.provenance import REPO_ROOT, append_ledger
from tt_serve import LLM, SamplingParams

LEDGER = REPO_ROOT / "bench/runs/tier-restore.jsonl"
SP = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
BS, CHUNK, SUFFIX = 64, 256, 40


def toks(n: int, seed: int, vocab: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(3, vocab) for _ in range(n)]


def engine(model: str, tokens: int, **kw: Any) -> LLM:
    pages = -(-(tokens + SUFFIX + SP.max_tokens) // BS)
    return LLM(
        model,
        block_size=BS,
        prefill_chunk=CHUNK,
        kv_blocks=pages + 2,  # one conversation: the others push it out
        snapshot_slots=2,
        max_batch_size=2,
        max_num_batched_tokens=1024,
        **kw,
    )


def ttft(m: LLM, prompt: list[int]) -> tuple[float, Any]:
    (out,) = m.generate([prompt], SP)
    assert out.first_token_time is not None and out.arrival_time is not None
    return out.first_token_time - out.arrival_time, out


def one(model: str, tokens: int, vocab: int, disk: Path) -> dict[str, Any]:
    head = toks(tokens, tokens, vocab)
    prompt = head + toks(SUFFIX, tokens + 1, vocab)
    others = [toks(tokens, tokens + 10 + i, vocab) for i in range(3)]
    cold_t, cold = ttft(engine(model, tokens), prompt)
    row: dict[str, Any] = {"tokens": tokens, "cold_ttft_s": round(cold_t, 4)}
    for tier in ("host", "disk"):
        kw: dict[str, Any] = (
            {"host_cache_gb": 4.0}
            if tier == "host"
            else {"disk_cache_dir": str(disk / str(tokens)), "disk_cache_gb": 8.0}
        )
        m = engine(model, tokens, **kw)
        m.generate([head + toks(SUFFIX, tokens + 2, vocab)], SP)
        for o in others:
            m.generate([o], SP)
        if tier == "disk":  # a restart: the units come from the files alone
            m.engine.close()
            m = engine(model, tokens, **kw)
        warm_t, warm = ttft(m, prompt)
        st = m.engine.stats().tiers
        assert st is not None
        row[tier] = {
            "cached_tokens": warm.cached_tokens,
            "equal_tokens": warm.token_ids == cold.token_ids,
            "ttft_s": round(warm_t, 4),
            "restores": st.restores,
            "restore_s": round(st.restore_seconds, 5),
            "restore_bytes": st.restore_bytes,
            "writethrough_s": round(st.writethrough_seconds, 5),
        }
        m.engine.close()
    spec = m.spec
    row["unit_bytes"] = spec.resume_unit_bytes(tokens // BS * BS, BS, 4)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.cache.tier_restore", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model", default=None, help="HF checkpoint folder (default: the demo model)")
    p.add_argument("--tokens", default="1024,4096,8192", help="context lengths, comma-separated")
    p.add_argument("--no-ledger", action="store_true")
    a = p.parse_args(argv)
    if a.model is None:
        from tt_serve.demo import ensure_demo_model

        a.model = str(ensure_demo_model())
    from tt_serve.model.spec import ModelSpec

    vocab = ModelSpec.from_hf_dir(a.model).vocab_size
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(t) for t in a.tokens.split(",")):
            row = one(a.model, n, vocab, Path(tmp))
            print(row, file=sys.stderr, flush=True)
            rows.append(row)
    if not a.no_ledger:
        append_ledger(
            LEDGER,
            "tier-restore",
            model=Path(a.model).name,
            block_size=BS,
            chunk=CHUNK,
            suffix=SUFFIX,
            rows=rows,
        )
        print(f"ledger: {LEDGER}", file=sys.stderr)
    return 0 if all(r[t]["equal_tokens"] for r in rows for t in ("host", "disk")) else 1


if __name__ == "__main__":
    sys.exit(main())
