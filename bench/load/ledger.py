"""The run ledger: one JSON line per A/B round, appended to ``bench/runs/<name>.jsonl``.

``python -m bench.load.ledger round`` runs every phase on both (already running) arms in the given
order, scrapes /metrics before and after each phase, and appends the line. The shell harness
(``bench/ab/lib.sh``) boots and kills the arms, waits for /health, runs the warm-up
(``python -m bench.load.ledger warmup``, never recorded) and alternates the order over rounds.

Each round uses the phase seeds plus the round number, so arm A and arm B see identical prompts
within a round while no round can hit the cache entries of an earlier one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from bench.common.provenance import (
    counter_deltas,
    git_info,
    hit_rate,
    machine_info,
    process_cpu_seconds,
    scrape,
    steal_seconds,
)
from bench.load.generator import run
from bench.load.workloads import WorkloadSpec

LEDGER_VERSION = 1
ROUND_KEYS = (
    "version",
    "name",
    "round",
    "timestamp",
    "order",
    "git",
    "machine",
    "arms",
    "differing_flag",
    "phases",
    "results",
)
PHASE_RESULT_KEYS = (
    "metrics",
    "server",
    "hit_rate",
    "server_cpu_s",
    "noise",
    "prompt_sha256",
    "requests",
    "errors",
)


def flag_settings(flags: list[str]) -> dict[str, str]:
    """``--x v`` / ``--x=v`` / ``--x`` / ``--no-x`` -> {"x": value}; for the one-flag check."""
    out: dict[str, str] = {}
    i = 0
    while i < len(flags):
        tok = flags[i]
        if not tok.startswith("--"):
            raise ValueError(f"unexpected argument {tok!r} in arm flags")
        name, eq, val = tok[2:].partition("=")
        if eq:
            out[name] = val
        elif i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            out[name] = flags[i + 1]
            i += 1
        elif name.startswith("no-"):
            out[name[3:]] = "false"
        else:
            out[name] = "true"
        i += 1
    return out


def differing_flag(a: list[str], b: list[str]) -> str:
    """The one setting in which the arms differ; ValueError unless there is exactly one."""
    sa, sb = flag_settings(a), flag_settings(b)
    diff = sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k))
    if len(diff) != 1:
        raise ValueError(f"arms must differ by exactly one flag, they differ by {diff}")
    return diff[0]


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def run_phase(url: str, spec: WorkloadSpec, pid: int | None = None) -> dict[str, Any]:
    """One workload on one arm, with /metrics (and the server's CPU time) read around it."""
    before = scrape(url)
    cpu0, steal0, load0 = process_cpu_seconds(pid), steal_seconds(), _loadavg()
    result = run(url, spec)
    cpu1, steal1, load1 = process_cpu_seconds(pid), steal_seconds(), _loadavg()
    deltas = counter_deltas(before, scrape(url))
    return {
        "metrics": result["metrics"],
        "server": deltas,
        "hit_rate": hit_rate(deltas),
        "server_cpu_s": _delta(cpu0, cpu1),
        "noise": {"steal_s": _delta(steal0, steal1), "loadavg_1m": [load0, load1]},
        "prompt_sha256": [r["prompt_sha256"] for r in result["requests"]],
        "requests": result["requests"],
        "errors": result["errors"],
    }


def run_round(a: argparse.Namespace) -> dict[str, Any]:
    arms = {
        "A": {"label": a.label_a, "url": a.url_a, "flags": shlex.split(a.flags_a), "pid": a.pid_a},
        "B": {"label": a.label_b, "url": a.url_b, "flags": shlex.split(a.flags_b), "pid": a.pid_b},
    }
    diff = differing_flag(arms["A"]["flags"], arms["B"]["flags"])
    phases: dict[str, WorkloadSpec] = {}
    for item in a.phase:
        name, _, text = item.partition("=")
        spec = WorkloadSpec.parse(text)
        phases[name] = WorkloadSpec(**{**spec.__dict__, "seed": spec.seed + a.round})
    results: dict[str, dict[str, Any]] = {}
    for arm in a.order:
        url, pid = arms[arm]["url"], arms[arm]["pid"]
        results[arm] = {name: run_phase(url, s, pid) for name, s in phases.items()}
    now = git_info()
    boot = json.loads(Path(a.boot_git).read_text()) if a.boot_git else now
    return {
        "version": {"ledger": LEDGER_VERSION, "tt_serve": _tt_serve_version()},
        "name": a.name,
        "round": a.round,
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "order": list(a.order),
        "git": boot,
        "git_at_round": now,
        "machine": machine_info(),
        "arms": arms,
        "differing_flag": diff,
        "phases": {name: s.params() for name, s in phases.items()},
        "results": results,
    }


def _tt_serve_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("tt-serve")
    except Exception:  # not installed: the ledger still records the source hash
        return None


def check_line(line: dict[str, Any]) -> list[str]:
    """Schema problems of one ledger line (empty when it is well formed)."""
    errs = [f"missing key {k}" for k in ROUND_KEYS if k not in line]
    if errs:
        return errs
    for key in ("commit", "dirty", "source_sha256"):
        if key not in line["git"]:
            errs.append(f"git.{key} missing")
    for key in ("cpu_model", "cores"):
        if key not in line["machine"]:
            errs.append(f"machine.{key} missing")
    if sorted(line["order"]) != ["A", "B"]:
        errs.append(f"order must hold A and B once: {line['order']}")
    for arm in ("A", "B"):
        if not isinstance(line["arms"].get(arm, {}).get("flags"), list):
            errs.append(f"arms.{arm}.flags missing")
        for phase in line["phases"]:
            res = line["results"].get(arm, {}).get(phase)
            if res is None:
                errs.append(f"results.{arm}.{phase} missing")
                continue
            errs += [
                f"results.{arm}.{phase}.{k} missing" for k in PHASE_RESULT_KEYS if k not in res
            ]
            m = res.get("metrics", {})
            for k in ("makespan_s", "completed", "failed", "ttft_s", "tpot_s", "itl_s", "e2el_s"):
                if k not in m:
                    errs.append(f"results.{arm}.{phase}.metrics.{k} missing")
    return errs


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load.ledger")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("round", help="run one A/B round on running arms, append a ledger line")
    r.add_argument("--name", required=True)
    r.add_argument("--ledger", required=True, help="JSONL file to append to")
    r.add_argument("--round", type=int, required=True)
    r.add_argument("--order", choices=("AB", "BA"), required=True)
    for arm in ("a", "b"):
        r.add_argument(f"--url-{arm}", required=True)
        r.add_argument(f"--flags-{arm}", required=True, help="the arm's full serve flags")
        r.add_argument(f"--label-{arm}", default=arm.upper())
        r.add_argument(f"--pid-{arm}", type=int, default=None, help="server pid (CPU time)")
    r.add_argument("--phase", action="append", required=True, help="NAME=kind:key=value,...")
    r.add_argument("--boot-git", default=None, help="git info JSON saved when the arms booted")
    sub.add_parser("git", help="print the git info (commit, dirty, source hash) as JSON")
    w = sub.add_parser("warmup", help="a few short requests, never recorded")
    w.add_argument("--url", required=True)
    w.add_argument("--workload", default="random:num=2,min_len=64,max_len=128,max_tokens=2")
    c = sub.add_parser("check", help="check the schema of every line of a ledger")
    c.add_argument("ledger")
    a = p.parse_args(argv)
    if a.cmd == "warmup":
        res = run(a.url, WorkloadSpec.parse(a.workload))
        for err in res["errors"]:
            print(f"warm-up request failed: {err}", file=sys.stderr)
        return 1 if res["metrics"]["failed"] else 0
    if a.cmd == "git":
        print(json.dumps(git_info()))
        return 0
    if a.cmd == "check":
        bad = 0
        for i, line in enumerate(read_ledger(a.ledger)):
            for e in check_line(line):
                print(f"line {i + 1}: {e}")
                bad += 1
        return 1 if bad else 0
    line = run_round(a)
    Path(a.ledger).parent.mkdir(parents=True, exist_ok=True)
    with open(a.ledger, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, separators=(",", ":")) + "\n")
    for arm in line["order"]:
        for name, res in line["results"][arm].items():
            m = res["metrics"]
            print(
                f"round {a.round} arm {arm} ({line['arms'][arm]['label']}) {name}: "
                f"makespan {m['makespan_s']:.2f}s ttft p50 {m['ttft_s']['p50']} "
                f"hit {res['hit_rate']} failed {m['failed']}"
            )
    failed = sum(
        res["metrics"]["failed"] for arm in line["results"].values() for res in arm.values()
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
