"""The disk tier against the engine step: step time while long units are restored from disk,
and disk bytes written per agent turn, each A/B in one run.

``steps`` (issue 55: "step p99 during disk restores at 128k within 1.2x the no-restore p99"):
two short requests decode all along; every ``--interval`` seconds a request arrives whose
``--tokens``-long history is on disk only (rotating over ``--units`` histories in a device
pool that holds one of them: every arrival restores from disk). The no-restore arm sends the
same history each time, a device hit after an untimed first, so the arms run the same traffic
for the same wall time and differ by the restores alone. Measured per arm, on one engine each,
the engine thread timing every ``Engine.step`` call: p50 / p99 / max step time, restores, and
each arrival's time to first token. Arms: ``device`` (no restore), ``in-step``
(``--disk-read-ahead-mb 0``: the step reads the disk) and ``read-ahead`` (the default: a
reader thread). The units are written straight into the disk store under the engine's own
keys at the pool's sizes (zero payloads: a read, its checks and the device write take the same
time whatever the values; a real 128k prefill on this CPU takes many minutes per history).
Warm == cold of a restore is the tier tests' job, not this bench's.

``turns``: the agent replay (``bench.agent_replay``: a shared head, tool-result turns) on an
engine with a disk tier, once with ``--disk-writeback all`` (every unit written through) and
once with ``resume`` (the default): disk bytes and units written per turn, on the demo model
or (``--turns-shape``) a random checkpoint at a published shape, whose snapshot-to-KV byte
ratio is the real model's. Then a restarted
engine on each folder takes every agent's next turn: the tokens it resumes from disk must be
the same under both policies (the cuts ``resume`` keeps are the ones a next turn uses).

    OMP_NUM_THREADS=2 python -m bench.cache.disk_io [--tokens 131072] [--only steps|turns]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common.provenance import REPO_ROOT, append_ledger
from tt_serve import SamplingParams
from tt_serve.cache import block_hashes
from tt_serve.cache.host_tier import UnitData
from tt_serve.config.serve_config import ServeConfig

LEDGER = REPO_ROOT / "bench/runs/disk-io.jsonl"
BS, CHUNK, SUFFIX = 64, 256, 40
DECODE = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
ARRIVAL = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def long_model(demo: Path, out: Path, tokens: int) -> Path:
    """The demo checkpoint with a context limit past ``tokens`` (its rotary has no limit)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in demo.iterdir():
        if f.name != "config.json":
            (out / f.name).symlink_to(f.resolve())
    cfg = json.loads((demo / "config.json").read_text())
    cfg["max_position_embeddings"] = max(cfg["max_position_embeddings"], 2 * tokens)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _engine(model: Path, disk: Path, tokens: int, read_ahead_mb: int) -> Any:
    from tt_serve.engine.factory import build_engine

    pages = -(-(tokens + SUFFIX + ARRIVAL.max_tokens) // BS)
    cfg = ServeConfig(
        model=str(model),
        block_size=BS,
        prefill_chunk=CHUNK,
        max_num_batched_tokens=1024,
        # one history and the decoders: the next history evicts the last
        kv_blocks=pages + 2 * -(-(3 + DECODE.max_tokens) // BS) + 2,
        snapshot_slots=2,
        max_batch_size=4,
        max_model_len=tokens + 1024,
        disk_cache_dir=str(disk),
        disk_cache_gb=8.0,
        disk_read_ahead_mb=read_ahead_mb,
        step_probe_seconds=0,
    )
    return build_engine(cfg)


def _histories(vocab: int, tokens: int, n: int) -> list[list[int]]:
    import random

    return [[random.Random(i).randrange(3, vocab) for _ in range(tokens)] for i in range(n)]


def plant_units(engine: Any, histories: list[list[int]]) -> None:
    """Each history's unit at its length, in the engine's disk store under its own keys."""
    from tt_serve.model.torch.units import block_nbytes, snapshot_nbytes

    tiers = engine.scheduler.cache.tiers
    pools = engine.backend.pools
    block, snap = bytes(block_nbytes(pools)), bytes(snapshot_nbytes(pools))
    for h in histories:
        hashes = tuple(block_hashes(h, BS, engine.config.cache_salt))
        data = UnitData(snap, (block,) * len(hashes))
        assert tiers.disk.write((hashes[-1], len(h)), hashes, data)


def run_steps(
    engine: Any, prompts: list[list[int]], interval: float, arrivals: int, warm: list[list[int]]
) -> dict[str, Any]:
    """Two decoders all along; an arrival every ``interval`` seconds (cycling ``prompts``, one
    at a time), after ``warm`` ran untimed; the same wall time in every arm. Returns the step
    times and each arrival's time to first token."""
    for prompt in warm:  # untimed: puts a history on the device
        engine.add_request("warm", prompt + list(range(3, 3 + SUFFIX)), ARRIVAL)
        while engine.has_unfinished():
            engine.step()
    decoders = iter(range(1 << 30))

    def decoder() -> str:
        rid = f"d{next(decoders)}"
        engine.add_request(rid, [5, 6, 7], DECODE)
        return rid

    running = {decoder(), decoder()}
    for _ in range(5):  # warm-up
        engine.step()
    times: list[float] = []
    during: list[float] = []  # the steps while an arrival waits for its first token
    ttft: list[float] = []
    live: dict[str, float] = {}
    t0 = time.perf_counter()
    end = t0 + arrivals * interval
    sent = 0
    while time.perf_counter() < end or live:
        now = time.perf_counter()
        if not live and sent < arrivals and now >= t0 + sent * interval:
            rid = f"a{sent}"
            suffix = list(range(3, 3 + SUFFIX))
            engine.add_request(rid, prompts[sent % len(prompts)] + suffix, ARRIVAL)
            live[rid] = now
            sent += 1
        waiting = bool(live) and len(ttft) < sent  # an arrival has no token yet
        start = time.perf_counter()
        outs = engine.step()
        times.append(time.perf_counter() - start)
        if waiting:
            during.append(times[-1])
        for o in outs:
            if o.request_id in live and len(o.token_ids) == 1:
                ttft.append(time.perf_counter() - live[o.request_id])
            if o.request_id in live and o.finished:
                del live[o.request_id]
            if o.request_id in running and o.finished:  # two decoders all along
                running.discard(o.request_id)
                running.add(decoder())
    for rid in running:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    st = engine.stats().tiers
    return {
        "times": times,
        "during": during,
        "ttft": ttft,
        "seconds": time.perf_counter() - t0,
        "arrivals": sent,
        "restores_disk": st.disk_hits,
        "reads_ahead": st.disk_reads_ahead,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of one arm pooled: step time quantiles, arrival TTFT, restores."""
    times = [t for r in runs for t in r["times"]]
    during = [t for r in runs for t in r["during"]]
    ttft = [t for r in runs for t in r["ttft"]]
    q = statistics.quantiles(times, n=100, method="inclusive")
    qd = statistics.quantiles(during, n=100, method="inclusive") if len(during) > 1 else [0.0] * 99
    return {
        "rounds": len(runs),
        "seconds": round(sum(r["seconds"] for r in runs), 1),
        "arrivals": sum(r["arrivals"] for r in runs),
        "steps": len(times),
        "step_p50_ms": round(1e3 * q[49], 2),
        "step_p99_ms": round(1e3 * q[98], 2),
        "step_max_ms": round(1e3 * max(times), 2),
        # the steps while an arrival waits for its first token (its restore, if any)
        "during_steps": len(during),
        "during_p50_ms": round(1e3 * qd[49], 2),
        "during_p99_ms": round(1e3 * qd[98], 2),
        "during_max_ms": round(1e3 * max(during, default=0.0), 2),
        "arrival_ttft_p50_s": round(statistics.median(ttft), 4) if ttft else None,
        "arrival_ttft_max_s": round(max(ttft), 4) if ttft else None,
        "restores_disk": sum(r["restores_disk"] for r in runs),
        "reads_ahead": sum(r["reads_ahead"] for r in runs),
    }


def bench_steps(a: argparse.Namespace, model: Path, tmp: Path) -> dict[str, Any]:
    from tt_serve.model.spec import ModelSpec

    spec = ModelSpec.from_hf_dir(model)
    hist = _histories(spec.vocab_size, a.tokens, a.units)
    out: dict[str, Any] = {
        "tokens": a.tokens,
        "unit_bytes": spec.resume_unit_bytes(a.tokens, BS, 4),
        "arrivals_per_round": a.arrivals,
        "interval_s": a.interval,
    }
    arms = {"device": a.read_ahead_mb, "in-step": 0, "read-ahead": a.read_ahead_mb}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    # Rounds interleave the arms, the order reversed every other round (a shared machine's
    # load drifts; the 128k steps themselves vary several-fold from minute to minute).
    for rnd in range(a.rounds):
        for name in list(arms) if rnd % 2 == 0 else reversed(list(arms)):
            disk = tmp / f"disk-{name}"
            eng = _engine(model, disk, a.tokens, arms[name])
            plant_units(eng, hist)
            prompts = hist[:1] if name == "device" else hist
            warm = prompts if name == "device" else []
            runs[name].append(run_steps(eng, prompts, a.interval, a.arrivals, warm))
            eng.close()
            shutil.rmtree(disk)
            print(name, rnd, summary(runs[name][-1:]), file=sys.stderr, flush=True)
    for name in arms:
        out[name] = summary(runs[name])
    base = out["device"]["step_p99_ms"]
    for name in ("in-step", "read-ahead"):
        # issue 55: the step p99 during restores against the no-restore arm's step p99
        out[name]["during_p99_vs_no_restore_p99"] = round(out[name]["during_p99_ms"] / base, 3)
    return out


def _turn(eng: Any, convs: list[Any], tok: Any, params: SamplingParams) -> list[Any]:
    """One turn of every agent at once; the finished outputs in agent order."""
    for c in convs:
        eng.add_request(f"a{c.agent}-t{c.turn}", c.prompt_ids(tok), params)
    done: dict[str, Any] = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    outs = [done[f"a{c.agent}-t{c.turn}"] for c in convs]
    bad = [o.error for o in outs if o.error]
    if bad:
        raise RuntimeError(f"a turn failed: {bad[0]}")
    return outs


def bench_turns(a: argparse.Namespace, model: Path, tmp: Path) -> dict[str, Any]:
    from bench.agent_replay import inprocess as I
    from bench.agent_replay.workload import Sizes, build
    from tt_serve.engine.factory import build_engine
    from tt_serve.tokenizer import load_tokenizer

    if a.turns_shape:
        from bench.common.checkpoint import write_checkpoint

        shaped = write_checkpoint(tmp / "shaped", a.turns_shape, a.turns_layers, 248320, 0)
        for f in model.iterdir():
            if f.name.startswith(("tokenizer", "generation")):
                (shaped / f.name).symlink_to(f.resolve())
        model = shaped
    tok = load_tokenizer(str(model))
    sizes = Sizes(agents=a.agents, turns=a.turns + 1, head=a.head, task=150, tool=300, answer=32)
    workload = build(sizes, 0, tok)
    answer = SamplingParams(max_tokens=sizes.answer, temperature=0.0, ignore_eos=True)
    first = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    shape = I.EngineShape(backend="torch", chunk=CHUNK, max_model_len=16384, max_batch=a.agents)
    base = replace(I.serve_config(str(model), shape), step_probe_seconds=0, disk_write_mb_per_s=0)
    out: dict[str, Any] = {
        "agents": a.agents,
        "turns": a.turns,
        "head": a.head,
        "shape": a.turns_shape or "demo",
        "layers": a.turns_layers if a.turns_shape else None,
    }
    next_tokens: dict[str, list[tuple[int, ...]]] = {}
    for policy in ("all", "resume"):
        cfg = replace(base, disk_cache_dir=str(tmp / f"turns-{policy}"), disk_writeback=policy)
        convs = [workload.conversation(i, "verbatim") for i in range(a.agents)]
        eng = build_engine(cfg, tokenizer=tok)
        for _ in range(a.turns):
            for c, o in zip(convs, _turn(eng, convs, tok, answer), strict=True):
                c.add(I.split_answer(list(o.token_ids), tok, False))
        eng.close()  # the write-backs reach the disk
        st = eng.stats().tiers
        turns = a.agents * a.turns
        row: dict[str, Any] = {
            "disk_bytes_written": st.disk_bytes_written,
            "disk_bytes_per_turn": st.disk_bytes_written // turns,
            "units_written_per_turn": round(st.writebacks_done / turns, 2),
            "units_kept_in_host_only": st.writebacks_skipped,
        }
        # A restart: every agent's next turn, resumed from the files alone.
        eng = build_engine(cfg, tokenizer=tok)
        outs = _turn(eng, convs, tok, first)
        st = eng.stats().tiers
        eng.close()
        row["after_restart"] = {
            "cached_tokens": [o.cached_tokens for o in outs],
            "prompt_tokens": [len(o.prompt_token_ids) for o in outs],
            "disk_hits": st.disk_hits,
        }
        next_tokens[policy] = [tuple(o.token_ids) for o in outs]
        out[policy] = row
        print(policy, row, file=sys.stderr, flush=True)
    cold_eng = build_engine(replace(base, prefix_caching=False), tokenizer=tok)
    cold = [tuple(o.token_ids) for o in _turn(cold_eng, convs, tok, first)]
    out["after_restart_equal_cold"] = {k: v == cold for k, v in next_tokens.items()}
    out["same_resume_depth"] = (
        out["all"]["after_restart"]["cached_tokens"]
        == out["resume"]["after_restart"]["cached_tokens"]
    )
    out["bytes_ratio_resume_vs_all"] = round(
        out["resume"]["disk_bytes_written"] / out["all"]["disk_bytes_written"], 3
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.cache.disk_io", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model", default=None, help="HF checkpoint folder (default: the demo model)")
    p.add_argument("--only", choices=("steps", "turns"), default=None)
    p.add_argument("--tokens", type=int, default=131072, help="history length of a restore")
    p.add_argument("--units", type=int, default=3, help="distinct histories on disk")
    p.add_argument("--arrivals", type=int, default=8)
    p.add_argument("--interval", type=float, default=8.0, help="seconds between arrivals")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the arms")
    p.add_argument("--read-ahead-mb", type=int, default=ServeConfig.disk_read_ahead_mb)
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--head", type=int, default=1500)
    p.add_argument(
        "--turns-shape",
        default=None,
        help="turns on a random checkpoint at a published shape (e.g. qwen3.5-0.8b) instead "
        "of the demo model: its snapshot / KV byte ratio",
    )
    p.add_argument("--turns-layers", type=int, default=4, help="layers of --turns-shape (3:1)")
    p.add_argument("--no-ledger", action="store_true")
    a = p.parse_args(argv)
    from tt_serve.demo import ensure_demo_model

    demo = Path(a.model) if a.model else ensure_demo_model()
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        model = long_model(demo, tmp / "model", a.tokens)
        if a.only in (None, "steps"):
            rows["steps"] = bench_steps(a, model, tmp)
        if a.only in (None, "turns"):
            rows["turns"] = bench_turns(a, model, tmp)
    if not a.no_ledger:
        append_ledger(LEDGER, "disk-io", model=demo.name, block_size=BS, chunk=CHUNK, **rows)
        print(f"ledger: {LEDGER}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
