"""Rolling restarts on `nixos-rebuild switch` (modules/lib/rollout.nix), evaluated with the stand-in lib.

The workers opt out of switch-to-configuration's restart (restartIfChanged = false) and the
oneshot tenstorrent-serving-rollout, triggered by their definitions, restarts them one at a time.
Its generated script is also run here, with a fake `systemctl`, `curl` and `sleep` on PATH
(shell stubs that log their calls), to show the order, the wait for /health and the failure when
a worker does not come back. What this cannot show: what a real switch does with these units
(that needs a NixOS machine; lib/rollout.nix cites the NixOS behaviour it relies on).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from tests.nix.nixtools import eval_module_stub
from tt_serve.config import ServeConfig, config_from_json_dict

THREE = {"enable": True, "instances": [[0], [1], [2]], "workerBasePort": 8100}
WORKERS = [f"tenstorrent-serving-worker-{i}" for i in range(3)]
ROLLOUT = "tenstorrent-serving-rollout"
HEALTH = [f"http://127.0.0.1:{8100 + i}/health" for i in range(3)]
SETTLE = 70  # sglang-router's 60 s open circuit + 2 health passes at 5 s (lib/args.nix)
HEALTH_TRIES = 30

STUBS = {
    # is-active prints the unit's state (state-<unit>, default active); restart exits with
    # restart-rc-<unit> (default 0).
    "systemctl": """#!/bin/sh
echo "systemctl $*" >> "$STUB/log"
case $1 in
  is-active) s=$(cat "$STUB/state-$2" 2>/dev/null || echo active); echo "$s"
             [ "$s" = active ] ;;
  restart) exit "$(cat "$STUB/restart-rc-$2" 2>/dev/null || echo 0)" ;;
esac
""",
    # The URL is the last argument; fail-<port> says how many calls fail before one succeeds.
    "curl": """#!/bin/sh
for url; do :; done
echo "curl $url" >> "$STUB/log"
port=${url#http://127.0.0.1:}; port=${port%%/*}
n=$(cat "$STUB/calls-$port" 2>/dev/null || echo 0); echo $((n + 1)) > "$STUB/calls-$port"
[ "$n" -ge "$(cat "$STUB/fail-$port" 2>/dev/null || echo 0)" ]
""",
    "sleep": """#!/bin/sh
echo "sleep $*" >> "$STUB/log"
""",
}


def units(settings: dict[str, Any]) -> dict[str, Any]:
    out = eval_module_stub(settings)
    assert out["problems"] == [] and out["failedAssertions"] == [], out
    result: dict[str, Any] = out["units"]
    return result


def run_rollout(tmp_path: Path, files: dict[str, str]) -> tuple[int, list[str], str]:
    """The generated script under bash -e (NixOS runs `script` so), with the stubs on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    script = tmp_path / "rollout.sh"
    script.write_text(units(THREE)[ROLLOUT]["script"])
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB": str(tmp_path)}
    result = subprocess.run(
        ["bash", "-e", str(script)], env=env, capture_output=True, text=True, timeout=30
    )
    log = (tmp_path / "log").read_text().splitlines() if (tmp_path / "log").exists() else []
    return result.returncode, log, result.stderr


def rolled(w: int) -> list[str]:
    return [f"systemctl restart {WORKERS[w]}", f"curl {HEALTH[w]}"]


def test_workers_are_left_to_the_rollout_unit() -> None:
    u = units(THREE)
    assert sorted(u) == sorted([*WORKERS, "tenstorrent-serving-router", ROLLOUT])
    assert [u[w]["restartIfChanged"] for w in WORKERS] == [False] * 3
    assert u["tenstorrent-serving-router"]["restartIfChanged"] is None  # NixOS default: true
    r = u[ROLLOUT]
    assert (r["type"], r["remainAfterExit"], r["stopIfChanged"]) == ("oneshot", True, False)
    assert r["wantedBy"] == ["multi-user.target"] and r["path"] == ["curl-stub"]
    # No ordering against the workers: its start job starts restart jobs on them.
    assert not set(r["after"] + r["before"] + r["wants"]) & {f"{w}.service" for w in WORKERS}
    assert len(r["restartTriggers"]) == 3 and len(set(r["restartTriggers"])) == 3
    calls = [
        line.split() for line in r["script"].splitlines() if line.startswith("restart_worker ")
    ]
    assert calls == [["restart_worker", w, url] for w, url in zip(WORKERS, HEALTH, strict=True)]
    # Bound: per worker its drain stop (30 + 20 s), start (60 min), health wait and settle.
    assert r["timeoutStartSec"] == f"{3 * (50 + 3600 + HEALTH_TRIES * 7 + SETTLE) + 60}s"


def test_triggers_follow_the_workers_definitions() -> None:
    base = units(THREE)[ROLLOUT]["restartTriggers"]
    for change in ({"maxBatchSize": 8}, {"environment": {"X": "1"}}, {"drainTimeout": 10}):
        changed = units({**THREE, **change})[ROLLOUT]["restartTriggers"]
        assert all(a != b for a, b in zip(base, changed, strict=True)), change
    # The worker units do not change with the router's policy, so neither does the rollout.
    assert units({**THREE, "routerPolicy": "round_robin"})[ROLLOUT]["restartTriggers"] == base
    assert units({**THREE, "instances": [[0], [1]]})[ROLLOUT]["restartTriggers"] == base[:2]


def test_rollout_restarts_one_worker_at_a_time(tmp_path: Path) -> None:
    rc, log, _ = run_rollout(tmp_path, {})
    assert rc == 0
    assert [line for line in log if not line.startswith("systemctl is-active")] == [
        *rolled(0),
        f"sleep {SETTLE}",  # worker 0 back in the router's rotation before worker 1 drains
        *rolled(1),
        f"sleep {SETTLE}",
        *rolled(2),
    ]


def test_rollout_waits_for_health(tmp_path: Path) -> None:
    rc, log, _ = run_rollout(tmp_path, {"fail-8101": "3"})  # worker 1 healthy on the 4th ask
    assert rc == 0
    at = log.index(f"systemctl restart {WORKERS[1]}")
    ask = f"curl {HEALTH[1]}"
    assert log[at + 1 : at + 8] == [ask, "sleep 2", ask, "sleep 2", ask, "sleep 2", ask]
    assert log.index(f"systemctl restart {WORKERS[2]}") > at + 8


def test_rollout_fails_naming_a_worker_that_never_comes_back(tmp_path: Path) -> None:
    rc, log, err = run_rollout(tmp_path, {"fail-8101": "1000000"})
    assert rc != 0
    assert WORKERS[1] in err and HEALTH[1] in err and "keep their old definition" in err
    assert log.count(f"curl {HEALTH[1]}") == HEALTH_TRIES  # bounded
    assert f"systemctl restart {WORKERS[2]}" not in log  # the others keep serving


def test_rollout_fails_when_a_restart_fails(tmp_path: Path) -> None:
    rc, log, err = run_rollout(tmp_path, {f"restart-rc-{WORKERS[0]}": "1"})
    assert rc != 0 and WORKERS[0] in err and "systemctl restart" in err
    assert [line for line in log if "restart" in line] == [f"systemctl restart {WORKERS[0]}"]


def test_rollout_skips_workers_that_are_not_serving(tmp_path: Path) -> None:
    """At boot the workers are activating: nothing is restarted (and no settle is waited)."""
    (tmp_path / "boot").mkdir()
    rc, log, _ = run_rollout(tmp_path / "boot", {f"state-{w}": "activating" for w in WORKERS})
    assert rc == 0 and log == [f"systemctl is-active {w}" for w in WORKERS]
    (tmp_path / "one-down").mkdir()
    rc, log, _ = run_rollout(tmp_path / "one-down", {f"state-{WORKERS[1]}": "failed"})
    assert rc == 0
    assert [line for line in log if not line.startswith("systemctl is-active")] == [
        *rolled(0),
        f"sleep {SETTLE}",
        *rolled(2),
    ]


def test_single_server_has_no_rollout() -> None:
    u = units({"enable": True})
    assert list(u) == ["tenstorrent-serving"]
    assert u["tenstorrent-serving"]["restartIfChanged"] is None  # restarted by the switch
    off = units({**THREE, "rollingRestart": {"enable": False}})
    assert ROLLOUT not in off and [off[w]["restartIfChanged"] for w in WORKERS] == [None] * 3


def test_rolling_restart_is_a_module_only_key() -> None:
    assert config_from_json_dict({"rollingRestart": {"enable": False}}) == ServeConfig()
