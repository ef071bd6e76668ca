"""tt-serve side by side with llama.cpp's ``llama-server``: interleaved rounds, both servers
restarted for every round, the same token-id prompts, a greedy cross-check first.

    python -m bench.peer --llama-server PATH/llama-server --gguf demo-f32.gguf --rounds 4

Round r runs the measure groups in order (``single``: cross-check, prefix hit, prefill, decode;
``c8``: 8 concurrent and sampled; ``c32``; ``long``); for each group, each side in turn (tt-serve
first in odd rounds, llama.cpp first in even ones) is started fresh, waited for, warmed up with one
short request, measured and stopped. Only one server runs at a time. At the end: medians per
measure and side over rounds, the ratio (> 1 = tt-serve better), one ledger line per run and a
Markdown table on stdout. See docs/peer.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from bench.common.provenance import REPO_ROOT, append_ledger
from bench.load.workloads import TOKEN_HI, token_range
from bench.peer import measures as M
from bench.peer import summary as S
from bench.peer.servers import LlamaServerSide, Running, Side, TtServeSide

DEFAULT_LEDGER = "bench/runs/peer.jsonl"
DEFAULT_MEASURES = ",".join(m for m in M.MEASURES if m != "long")


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc
    if any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError("every length must be >= 1")
    return vals


def _shape(text: str) -> M.Shape:
    try:
        return M.Shape.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _measures(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in M.MEASURES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown measure(s) {bad}; choose from {M.MEASURES}")
    return [m for m in M.MEASURES if m in names]


def parser() -> argparse.ArgumentParser:
    d = M.Sizes()
    p = argparse.ArgumentParser(
        prog="python -m bench.peer", description=(__doc__ or "").split("\n\n")[0]
    )
    p.add_argument("--llama-server", help="path of a built llama-server binary")
    p.add_argument("--gguf", help="GGUF of the same checkpoint (e.g. the demo model in f32)")
    p.add_argument("--model", default=None, help="HF checkpoint folder (default: the demo model)")
    p.add_argument("--threads", type=int, default=2, help="threads for each server (default 2)")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    p.add_argument(
        "--measures",
        type=_measures,
        default=_measures(DEFAULT_MEASURES),
        help=f"comma-separated, from {','.join(M.MEASURES)} (default {DEFAULT_MEASURES}; "
        "--long adds long)",
    )
    p.add_argument(
        "--long",
        type=_ints,
        default=(),
        help="prompt lengths for the long cold/warm TTFT measure, e.g. 2048,8192,30000",
    )
    p.add_argument("--seed", type=int, default=0, help="base seed of the prompts")
    p.add_argument("--ledger", default=DEFAULT_LEDGER, help=f"(default {DEFAULT_LEDGER})")
    p.add_argument("--no-ledger", action="store_true", help="print only, append nothing")
    p.add_argument("--log-dir", default="bench/out/peer", help="server logs (git-ignored)")
    p.add_argument("--health-timeout", type=float, default=300.0)
    p.add_argument("--tt-args", default="", help="extra tt-serve serve flags, one string")
    p.add_argument("--llama-args", default="", help="extra llama-server flags, one string")
    g = p.add_argument_group("sizes (defaults: the sizes of issue 18)")
    g.add_argument("--prefix-head", type=int, default=d.prefix_head)
    g.add_argument("--prefix-suffix", type=int, default=d.prefix_suffix)
    g.add_argument("--prefill", type=int, default=d.prefill, help="cold prefill prompt tokens")
    g.add_argument("--decode-prompt", type=int, default=d.decode_prompt)
    g.add_argument("--decode-tokens", type=int, default=d.decode_tokens)
    g.add_argument("--c8", type=_shape, default=d.c8, help=f"CxP+O (default {d.c8})")
    g.add_argument("--c32", type=_shape, default=d.c32, help=f"CxP+O (default {d.c32})")
    g.add_argument("--sampled", type=_shape, default=d.sampled, help=f"(default {d.sampled})")
    g.add_argument("--crosscheck-tokens", type=int, default=d.crosscheck_tokens)
    g.add_argument("--long-suffix", type=int, default=d.long_suffix)
    # The harness's own test: a second tt-serve stands in for llama-server (same code paths
    # except the peer's command line and its probe endpoint).
    p.add_argument(
        "--peer-kind",
        choices=("llama-server", "tt-serve"),
        default="llama-server",
        help=argparse.SUPPRESS,
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser()
    a = p.parse_args(argv)
    if a.peer_kind == "llama-server" and not (a.llama_server and a.gguf):
        p.error("--llama-server and --gguf are required")
    if a.threads < 1 or a.rounds < 1:
        p.error("--threads and --rounds must be >= 1")
    if a.long and "long" not in a.measures:
        a.measures = [*a.measures, "long"]
    if "long" in a.measures and not a.long:
        p.error("the long measure needs --long LENGTHS")
    return a


def sizes_of(a: argparse.Namespace) -> M.Sizes:
    return M.Sizes(
        crosscheck_tokens=a.crosscheck_tokens,
        prefix_head=a.prefix_head,
        prefix_suffix=a.prefix_suffix,
        prefill=a.prefill,
        decode_prompt=a.decode_prompt,
        decode_tokens=a.decode_tokens,
        c8=a.c8,
        c32=a.c32,
        sampled=a.sampled,
        long=tuple(a.long),
        long_suffix=a.long_suffix,
    )


def groups_for(measures: list[str]) -> list[tuple[str, list[str]]]:
    """(group, its selected measures) in run order; the cross-check always opens the run."""
    out = []
    for g, names in M.GROUPS.items():
        chosen = [n for n in names if n == "crosscheck" or n in measures]
        if chosen:
            out.append((g, chosen))
    return out


def order_of(round_no: int) -> list[str]:
    """tt-serve first in odd rounds, the peer first in even ones."""
    return ["tt", "peer"] if round_no % 2 else ["peer", "tt"]


def _model_dir(a: argparse.Namespace) -> str:
    if a.model:
        return str(Path(a.model).resolve())
    from tt_serve.demo import ensure_demo_model

    return str(ensure_demo_model())


def vocab_range(model: str) -> tuple[int, int]:
    """[lo, hi) of plain prompt ids for the checkpoint in ``model`` (its config.json)."""
    try:
        vocab = int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])
    except (OSError, KeyError, ValueError):
        vocab = 0
    return token_range(0 if vocab >= TOKEN_HI else vocab)


def _renderer(model: str) -> Any:
    """Token id -> the text tt-serve keys its top logprobs by (its own tokenizer's decode)."""
    from tt_serve.tokenizer import load_tokenizer

    tok = load_tokenizer(model)
    if tok is None:
        return str
    return lambda t: tok.decode([t], skip_special_tokens=False)


def build_sides(a: argparse.Namespace, model: str) -> dict[str, Side]:
    tt = TtServeSide(model, a.threads, shlex.split(a.tt_args))
    peer: Side
    if a.peer_kind == "tt-serve":
        peer = TtServeSide(model, a.threads, shlex.split(a.llama_args), label="tt-serve (peer)")
    else:
        peer = LlamaServerSide(
            str(Path(a.llama_server).resolve()),
            str(Path(a.gguf).resolve()),
            a.threads,
            render=_renderer(model),
            extra=shlex.split(a.llama_args),
        )
    return {"tt": tt, "peer": peer}


def run_round(
    round_no: int,
    sides: dict[str, Side],
    a: argparse.Namespace,
    sizes: M.Sizes,
    lo_hi: tuple[int, int],
    log_dir: Path,
) -> dict[str, Any]:
    seed = a.seed + 1000 * round_no
    prompts = M.Prompts(seed, *lo_hi)
    order = order_of(round_no)
    rec: dict[str, Any] = {"round": round_no, "order": order, "sides": {"tt": {}, "peer": {}}}
    for group, names in groups_for(a.measures):
        slots = sizes.slots(group)
        for key in order:
            side = sides[key]
            log = log_dir / f"r{round_no}-{group}-{key}.log"
            print(f"round {round_no} {group}: {side.label} ...", file=sys.stderr, flush=True)
            with Running(side, slots, log) as srv:
                srv.wait_healthy(a.health_timeout)
                got = asyncio.run(M.run_group(srv, names, sizes, prompts, seed))
            rec["sides"][key].update(got)
            for name, entry in got.items():
                if entry["error"]:
                    print(f"  {name}: ERROR {entry['error']}", file=sys.stderr)
                else:
                    shown = {k: round(v, 4) for k, v in entry["metrics"].items() if v is not None}
                    print(f"  {name}: {shown}", file=sys.stderr)
    probes = [rec["sides"][k].get("crosscheck", {}).get("detail", {}).get("probe") for k in order]
    if all(probes):
        tt = rec["sides"]["tt"]["crosscheck"]["detail"]["probe"]
        peer = rec["sides"]["peer"]["crosscheck"]["detail"]["probe"]
        rec["crosscheck"] = S.compare_probes(tt, peer)
        print(f"  crosscheck: {rec['crosscheck']}", file=sys.stderr)
    return rec


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    sizes = sizes_of(a)
    model = _model_dir(a)
    sides = build_sides(a, model)
    lo_hi = vocab_range(model)
    log_dir = (REPO_ROOT / a.log_dir) if not Path(a.log_dir).is_absolute() else Path(a.log_dir)
    rounds = [run_round(r, sides, a, sizes, lo_hi, log_dir) for r in range(1, a.rounds + 1)]
    table_rows = S.rows(sizes, a.measures)
    agg = S.aggregate(rounds, table_rows)
    cross = S.crosscheck_summary(rounds)
    load = S.load_summary(rounds)
    print(S.markdown(agg, cross, load, peer_label=sides["peer"].label))
    if not a.no_ledger:
        flags = {k: (str(v) if isinstance(v, M.Shape) else v) for k, v in vars(a).items()}
        for k in ("llama_server", "gguf", "model", "ledger", "log_dir"):
            if flags.get(k):
                flags[k] = Path(flags[k]).name  # no machine paths in a committed ledger
        groups = {
            g: {k: sides[k].describe(sizes.slots(g)) for k in ("tt", "peer")}
            for g, _ in groups_for(a.measures)
        }
        ledger = Path(a.ledger)
        ledger = ledger if ledger.is_absolute() else REPO_ROOT / ledger
        append_ledger(
            ledger,
            "peer",
            flags=flags,
            model=Path(model).name,
            sides={k: s.label for k, s in sides.items()},
            servers=groups,
            summary=agg,
            crosscheck=cross,
            load=load,
            rounds=rounds,
        )
        print(f"ledger: {ledger}", file=sys.stderr)
    failed = any(e["error"] for r in rounds for side in r["sides"].values() for e in side.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
