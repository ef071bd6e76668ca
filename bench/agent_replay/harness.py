"""The agent replay's command line: the arms over HTTP, or the in-process engine; one ledger line
per run (``bench/runs/agent-replay.jsonl``) and the Markdown tables on stdout.

    python -m bench.agent_replay http --arms default,responses,messages,llama.cpp \\
        --llama-server PATH/llama-server --gguf demo-f32.gguf
    python -m bench.agent_replay inprocess --backend ttnn-virtual --chunk 2048

HTTP arms, each started fresh for every answer mode (so every run starts with a cold cache),
one server at a time, waited for on ``/health`` and warmed up with one short unrelated request:

* ``default``: tt-serve as it starts (resume points at messages), through chat completions;
* ``resume-messages``: tt-serve with ``--resume-points messages``;
* ``resume-chunks``: tt-serve with ``--resume-points chunks`` (the A/B control);
* ``responses``: tt-serve through the Responses API, each later turn only its new items with
  ``previous_response_id`` (the exact continuation);
* ``responses-stateless``: the Responses API, the whole history every turn, ``store: false``;
* ``messages``: the Anthropic Messages API, the whole history every turn (``apis.py``);
* ``llama.cpp``: ``llama-server`` on a GGUF of the same checkpoint, ``--parallel`` = agents,
  each slot's context the longest prompt plus the answer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.agent_replay import client as C
from bench.agent_replay import summary as S
from bench.agent_replay.apis import API_ARMS
from bench.agent_replay.workload import MODES, Sizes, Workload, build
from bench.common.provenance import REPO_ROOT, append_ledger
from bench.peer.measures import LoadSample, load_between
from bench.peer.servers import LlamaServerSide, Running, Side, Slots, TtServeSide
from tt_serve.config.serve_config import RESUME_POINTS, ServeConfig

DEFAULT_LEDGER = "bench/runs/agent-replay.jsonl"
TT_ARMS = {
    "default": [],
    "resume-messages": ["--resume-points", "messages"],
    "resume-chunks": ["--resume-points", "chunks"],
    **{api: [] for api in API_ARMS},
}
ARMS = (*TT_ARMS, "llama.cpp")


def _choices(allowed: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"choose from {','.join(allowed)}; got {text!r}")
        return names

    return parse


def _common(p: argparse.ArgumentParser) -> None:
    d = Sizes()
    p.add_argument("--model", default=None, help="HF checkpoint folder (default: the demo model)")
    p.add_argument("--agents", type=int, default=d.agents)
    p.add_argument("--turns", type=int, default=d.turns)
    p.add_argument("--head", type=int, default=d.head, help="system + tools tokens")
    p.add_argument("--task", type=int, default=d.task, help="first user message tokens")
    p.add_argument("--tool", type=int, default=d.tool, help="tool result tokens")
    p.add_argument("--answer", type=int, default=d.answer, help="generated tokens per turn")
    p.add_argument(
        "--modes",
        type=_choices(MODES),
        default=list(MODES),
        help=f"answer modes, comma-separated (default {','.join(MODES)})",
    )
    p.add_argument(
        "--thinking",
        action="store_true",
        help="enable_thinking on (default off: the generation prompt closes an empty think block)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ledger", default=DEFAULT_LEDGER, help=f"(default {DEFAULT_LEDGER})")
    p.add_argument("--no-ledger", action="store_true", help="print only, append nothing")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.agent_replay", description=(__doc__ or "").split("\n\n")[0]
    )
    sub = p.add_subparsers(dest="driver", required=True)
    h = sub.add_parser("http", help="the arms over HTTP, each server started fresh")
    _common(h)
    h.add_argument(
        "--arms",
        type=_choices(ARMS),
        default=["resume-messages", "resume-chunks"],
        help=f"comma-separated, from {','.join(ARMS)} (default resume-messages,resume-chunks; "
        "llama.cpp needs --llama-server and --gguf)",
    )
    h.add_argument("--llama-server", help="path of a built llama-server binary")
    h.add_argument("--gguf", help="GGUF of the same checkpoint (e.g. the demo model in f32)")
    h.add_argument(
        "--llama-commit",
        default=None,
        help="the llama.cpp commit built, for the ledger (when `llama-server --version` cannot "
        "know it: a source tree without git reports 'unknown')",
    )
    h.add_argument("--threads", type=int, default=2, help="threads for each server (default 2)")
    h.add_argument("--tt-args", default="", help="extra tt-serve serve flags, one string")
    h.add_argument("--llama-args", default="", help="extra llama-server flags, one string")
    h.add_argument("--log-dir", default="bench/out/agent-replay", help="server logs (ignored)")
    h.add_argument("--health-timeout", type=float, default=300.0)
    i = sub.add_parser("inprocess", help="the same conversations through an in-process engine")
    _common(i)
    i.add_argument("--backend", choices=("torch", "ttnn-virtual"), default="torch")
    i.add_argument("--chunk", type=int, default=256, help="prefill chunk C (default 256)")
    i.add_argument(
        "--resume-points",
        choices=RESUME_POINTS,
        default=ServeConfig.resume_points,
        help="the resume rule (default %(default)s; chunks: the A/B control)",
    )
    i.add_argument("--max-batch", type=int, default=0, help="0: the number of agents")
    i.add_argument(
        "--pool-agents",
        type=int,
        default=0,
        help="size the KV pool (and snapshot slots) for this many agents' whole histories "
        "(0: the default pool)",
    )
    i.add_argument("--rounds", type=int, default=1, help="repeat the arms, interleaved (default 1)")
    i.add_argument(
        "--schedules",
        type=_schedules,
        default=["default"],
        help="comma-separated step schedules: default (the server's) and lockstep (every "
        "prefilling request in every step, all-prefill and all-decode steps: the default "
        "before issue 47)",
    )
    i.add_argument(
        "--tiers-ab",
        type=float,
        default=0.0,
        metavar="GB",
        help="run every mode twice in one run: host tier off, then on with GB GiB",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser()
    a = p.parse_args(argv)
    try:
        a.sizes = Sizes(a.agents, a.turns, a.head, a.task, a.tool, a.answer)
    except ValueError as exc:
        p.error(str(exc))
    if a.driver == "http":
        if "llama.cpp" in a.arms and not (a.llama_server and a.gguf):
            p.error("the llama.cpp arm needs --llama-server and --gguf")
        if a.threads < 1:
            p.error("--threads must be >= 1")
    elif a.chunk < 1:
        p.error("--chunk must be >= 1")
    return a


def _model_dir(a: argparse.Namespace) -> str:
    if a.model:
        return str(Path(a.model).resolve())
    from tt_serve.demo import ensure_demo_model

    return str(ensure_demo_model())


def _tokenizer(model: str) -> Any:
    from tt_serve.tokenizer import load_tokenizer

    tok = load_tokenizer(model)
    if tok is None:
        raise SystemExit(f"{model} ships no tokenizer: chat needs one")
    return tok


def build_side(arm: str, a: argparse.Namespace, model: str) -> Side:
    if arm == "llama.cpp":
        return LlamaServerSide(
            str(Path(a.llama_server).resolve()),
            str(Path(a.gguf).resolve()),
            a.threads,
            extra=shlex.split(a.llama_args),
        )
    extra = TT_ARMS[arm] + shlex.split(a.tt_args)
    return TtServeSide(model, a.threads, extra, label=f"tt-serve {arm}")


def request_extras(side: Side) -> dict[str, Any]:
    """tt-serve returns the generated ids (for the resumable prefix); llama-server reuses its
    slot's prompt (its default, said explicitly)."""
    if isinstance(side, LlamaServerSide):
        return {"cache_prompt": True}
    return {"return_token_ids": True}


def arm_api(arm: str) -> str:
    """The API an arm's requests go through."""
    return arm if arm in API_ARMS else "chat"


def run_arm(
    side: Side,
    mode: str,
    workload: Workload,
    render: C.Rendering,
    a: argparse.Namespace,
    api: str = "chat",
) -> dict[str, Any]:
    sizes = workload.sizes
    slots = Slots(sizes.agents, sizes.longest_prompt() + sizes.answer)
    log_dir = Path(a.log_dir) if Path(a.log_dir).is_absolute() else REPO_ROOT / a.log_dir
    log = log_dir / f"{side.label.replace(' ', '-')}-{mode}.log"
    print(f"{side.label} {mode} ...", file=sys.stderr, flush=True)
    extras = request_extras(side)
    with Running(side, slots, log) as srv:
        srv.wait_healthy(a.health_timeout)
        asyncio.run(C.warm_up(srv.url, extras))
        before = LoadSample.take(srv.pid)
        replay = C.run_replay(srv.url, workload, mode, render, extras, api=api)
        records, makespan = asyncio.run(replay)
        load = load_between(before, LoadSample.take(srv.pid))
    out = S.summarize(records, makespan)
    out["load"] = load
    out["server"] = side.describe(slots)
    if isinstance(side, LlamaServerSide) and a.llama_commit:
        out["server"]["commit"] = a.llama_commit
    g = out["later_turns"]
    print(
        f"  within bound {g['within']}/{g['judged']}, computed p50 {g['computed_p50']}, "
        f"makespan {makespan:.1f} s, foreign cores {load['foreign_cores']}, "
        f"failed {out['failed']} {out['errors']}",
        file=sys.stderr,
    )
    return out


def _flags(a: argparse.Namespace) -> dict[str, Any]:
    flags = {k: v for k, v in vars(a).items() if k not in ("sizes", "ledger")}
    for k in ("llama_server", "gguf", "model", "log_dir"):
        if flags.get(k):
            flags[k] = Path(flags[k]).name  # no machine paths in a committed ledger
    return flags


def _ledger(a: argparse.Namespace, model: str, runs: dict[str, Any], **fields: Any) -> None:
    if a.no_ledger:
        return
    ledger = Path(a.ledger)
    ledger = ledger if ledger.is_absolute() else REPO_ROOT / ledger
    append_ledger(
        ledger,
        "agent-replay",
        driver=a.driver,
        flags=_flags(a),
        model=Path(model).name,
        sizes=asdict(a.sizes),
        bound={"slack": S.SLACK, "fixed": S.FIXED},
        runs=runs,
        **fields,
    )
    print(f"ledger: {ledger}", file=sys.stderr)


def main_http(a: argparse.Namespace, model: str, workload: Workload, tok: Any) -> int:
    render = C.Rendering(tok, tok.token_to_id(C.IM_START))
    runs: dict[str, Any] = {}
    for arm in a.arms:
        side = build_side(arm, a, model)
        for mode in a.modes:
            runs[f"{arm} {mode}"] = run_arm(side, mode, workload, render, a, arm_api(arm))
    print(S.markdown(runs))
    _ledger(a, model, runs)
    return 1 if any(r["failed"] for r in runs.values()) else 0


def _progress(r: Any) -> None:
    print(
        f"  agent {r.agent} turn {r.turn}: prompt {r.prompt_tokens}, cached {r.cached_tokens}, "
        f"{r.e2el:.1f} s",
        file=sys.stderr,
        flush=True,
    )


def _schedules(text: str) -> list[str]:
    from bench.agent_replay.inprocess import SCHEDULES  # the engine's imports: only when asked

    return list(_choices(SCHEDULES)(text))


def main_inprocess(a: argparse.Namespace, model: str, workload: Workload, tok: Any) -> int:
    from bench.agent_replay import inprocess as I

    sizes = workload.sizes
    # The rendered first prompt (a small --head is outgrown by the tools' schemas), then every
    # later turn's answer, tool result and template tokens.
    first = len(workload.conversation(0, a.modes[0]).prompt_ids(tok))
    last = max(sizes.longest_prompt(), first + (sizes.turns - 1) * (sizes.answer + sizes.tool + 64))
    shape = I.EngineShape(
        backend=a.backend,
        chunk=a.chunk,
        max_model_len=last + sizes.answer + a.chunk,
        max_batch=a.max_batch or sizes.agents,
        resume_points=a.resume_points,
    )
    if a.pool_agents:
        bs = ServeConfig.block_size
        per_agent = -(-(last + sizes.answer) // bs)
        shape = replace(
            shape,
            kv_blocks=a.pool_agents * per_agent + 1,
            snapshot_slots=max(1, a.pool_agents * ServeConfig.snapshots_per_conversation // 2),
        )
    rule = a.resume_points
    arms = [("", 0.0)] if not a.tiers_ab else [("tiers off", 0.0), ("tiers on", a.tiers_ab)]
    if a.schedules != ["default"]:
        arms = [(f"{x} {sched}".strip(), gb) for x, gb in arms for sched in a.schedules]
    runs: dict[str, Any] = {}
    for mode in a.modes:
        # Rounds interleave the arms, the order alternating, so that other load on a shared
        # machine falls on both: compare the makespans of one round, or their medians.
        for r in range(a.rounds):
            for arm, gb in arms if r % 2 == 0 else arms[::-1]:
                label = f"{a.backend} C={a.chunk} {rule} {mode}" + (f" {arm}" if arm else "")
                label += f" r{r}" if a.rounds > 1 else ""
                print(f"{label} ...", file=sys.stderr, flush=True)
                # A fresh engine (cold cache) for every mode, arm and round.
                schedule = "lockstep" if arm.endswith("lockstep") else "default"
                engine = I.build_engine(
                    model, replace(shape, host_cache_gb=gb, schedule=schedule), tok
                )
                load0 = os.getloadavg()[0]
                records, makespan = I.replay(engine, workload, mode, tok, progress=_progress)
                runs[label] = S.summarize(records, makespan)
                runs[label]["prefill_tokens_computed"] = engine.stats().prefill_tokens_computed
                sched = engine.scheduler
                fit = sched.prefill_rows.fit() if sched.prefill_rows is not None else None
                runs[label]["schedule"] = {
                    "prefill_rows": sched.max_prefill_rows,  # at the end; 0: all
                    "measured": sched.prefill_rows is not None,
                    "fit_a_s_b_s_per_token": fit,
                    "mixed_steps": sched.config.mixed_steps,
                }
                runs[label]["loadavg_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
                tiers = engine.stats().tiers
                if tiers is not None:
                    runs[label]["tiers"] = asdict(tiers)
                engine.close()
    print(S.markdown(runs))
    engine_fields = {"backend": a.backend, "chunk": a.chunk, "rule": rule}
    engine_fields |= {"kv_blocks": shape.kv_blocks, "snapshot_slots": shape.snapshot_slots}
    _ledger(a, model, runs, engine=engine_fields)
    return 1 if any(r["failed"] for r in runs.values()) else 0


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    model = _model_dir(a)
    tok = _tokenizer(model)
    workload = build(a.sizes, a.seed, tok, thinking=a.thinking)
    if a.driver == "http":
        return main_http(a, model, workload, tok)
    return main_inprocess(a, model, workload, tok)


if __name__ == "__main__":
    sys.exit(main())
