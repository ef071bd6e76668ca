"""The NixOS module with `instances`: 4 workers plus a router, evaluated with the stand-in lib.

Checks the units (names, ports, argv through the real `tt-serve serve` parser, per-unit state
folders, stop timeouts covering the drain) and the router's command line (its worker list and
policy), which must equal what scripts/serve-replicas runs for the same settings.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from typing import Any

from tests.nix.nixtools import ROOT, eval_module_stub
from tt_serve.config import ServeConfig, add_serve_arguments, config_from_json_dict, validate

P = "services.tenstorrent-serving"
FOUR = {
    "enable": True,
    "backend": "ttnn",
    "host": "0.0.0.0",
    "port": 8000,
    "instances": [[0], [1], [2], [3]],
    "workerBasePort": 8100,
    "routerPolicy": "cache_aware",
    "drainTimeout": 45,
}
WORKERS = [f"tenstorrent-serving-worker-{i}" for i in range(4)]


def parse_serve(exec_start: str) -> ServeConfig:
    argv = shlex.split(exec_start)
    assert argv[0].endswith("/bin/tt-serve") and argv[1] == "serve"
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_serve_arguments(parser)
    return ServeConfig.from_args(parser.parse_args(argv[2:]))


def units(settings: dict[str, Any]) -> dict[str, Any]:
    out = eval_module_stub(settings)
    assert out["problems"] == [] and out["failedAssertions"] == [], out
    result: dict[str, Any] = out["units"]
    return result


def test_four_workers_and_a_router() -> None:
    u = units(FOUR)
    # The rollout unit (rolling restarts on switch) is tests/nix/test_module_rollout.py's.
    assert sorted(u) == sorted(
        [*WORKERS, "tenstorrent-serving-router", "tenstorrent-serving-rollout"]
    )
    for i, name in enumerate(WORKERS):
        cfg = parse_serve(u[name]["execStart"])
        assert (cfg.host, cfg.port, cfg.device_ids) == ("127.0.0.1", 8100 + i, (i,))
        assert cfg.backend == "ttnn" and cfg.drain_timeout == 45 and validate(cfg) == []
        assert u[name]["execStartPost"].endswith(f" http://127.0.0.1:{8100 + i}/health")
        assert u[name]["timeoutStopSec"] == "65s"  # drainTimeout + the 20 s shutdown margin
        assert u[name]["stateDirectory"] == name and u[name]["home"] == f"/var/lib/{name}"
    router = shlex.split(u["tenstorrent-serving-router"]["execStart"])
    assert router[0] == "/nix/store/00000000000000000000000000000000-sglang-router-stub/bin/smg"
    assert router[1] == "launch"
    at = router.index("--worker-urls")
    assert router[at + 1 : at + 5] == [f"http://127.0.0.1:{8100 + i}" for i in range(4)]
    assert router[at + 5].startswith("--")
    flag = {router[i]: router[i + 1] for i in range(1, len(router) - 1) if router[i][:2] == "--"}
    assert flag["--host"] == "0.0.0.0" and flag["--port"] == "8000"  # where one server was
    assert flag["--policy"] == "cache_aware"
    assert flag["--prometheus-host"] == "127.0.0.1" and flag["--prometheus-port"] == "29000"
    assert flag["--health-check-endpoint"] == "/health"
    assert u["tenstorrent-serving-router"]["wants"] == WORKERS


def test_router_argv_equals_the_local_launcher() -> None:
    settings = {**FOUR, "host": "127.0.0.1", "port": 30000, "routerPolicy": "round_robin"}
    router = shlex.split(units(settings)["tenstorrent-serving-router"]["execStart"])[1:]
    launcher = subprocess.run(
        [sys.executable, str(ROOT / "scripts/serve-replicas"), "--replicas", "4", "--port",
         "30000", "--policy", "round_robin", "--print-argv"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(launcher.stdout)["router"] == router


def test_no_instances_is_one_server_as_before() -> None:
    u = units({"enable": True})
    assert list(u) == ["tenstorrent-serving"]
    assert parse_serve(u["tenstorrent-serving"]["execStart"]) == ServeConfig()
    assert u["tenstorrent-serving"]["timeoutStopSec"] == "50s"


def test_cuda_workers_get_one_device_each() -> None:
    u = units({"enable": True, "device": "cuda", "instances": [[2], [5]]})
    devices = [
        parse_serve(u[f"tenstorrent-serving-worker-{i}"]["execStart"]).device for i in (0, 1)
    ]
    assert devices == ["cuda:2", "cuda:5"]


def test_topology_errors_reach_the_module() -> None:
    bad = {"enable": True, "instances": [[0], [0]], "port": 8101}
    out = eval_module_stub(bad)
    assert out["failedAssertions"] == validate(config_from_json_dict(bad))
    assert [m.split(" ")[0] for m in out["failedAssertions"]] == [f"{P}.instances", f"{P}.port"]
