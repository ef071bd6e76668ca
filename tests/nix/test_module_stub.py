"""The NixOS module evaluated against a small stand-in for nixpkgs lib (tests/nix/stub-nixpkgs).

What the stand-in checks: option names, defaults from modules/lib/defaults.nix, declared types,
unknown options, mkIf wiring, the assertions list, ExecStart, firewall ports and the unit's
hardening settings. What it does NOT check: real option merging and priorities (mkDefault,
mkForce), submodules, and whether the systemd/users/firewall/udev settings are valid NixOS
options or a valid systemd unit. Those need real nixpkgs (`nix flake check`, which evaluates the
example host's toplevel).

The argv the module builds is also fed to the real `tt-serve serve` argument parser.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.nix.nixtools import ROOT, eval_module_stub, nix_eval_json
from tt_serve.config import (
    PRECISIONS,
    ServeConfig,
    add_serve_arguments,
    config_from_json_dict,
    dry_run,
    serve_flag_fields,
    validate,
)

P = "services.tenstorrent-serving"
EXAMPLE_HOST = {
    "backend": "ttnn",
    "model": "/srv/models/Qwen3.6 35B",
    "servedModelName": "qwen3.6",
    "host": "0.0.0.0",
    "openFirewall": True,
    "deviceResident": True,
    "tracedPrefill": True,
    "prefillChunk": 2048,
    "deviceIds": [1],
    "precision": "mixed",
    "maxBatchSize": 32,
    "maxModelLen": 32768,
    "maxNumBatchedTokens": 4096,
    "apiKeyFile": "/run/keys/api key",
    "hostCacheGb": 96,
    "diskCacheDir": "/var/cache/tt-serve",
    "diskCacheGb": 512.5,
}


def serve_argv(exec_start: str, credentials_dir: str = "/run/credentials/x") -> list[str]:
    """ExecStart= as systemd would split it, minus the binary and the `serve` subcommand."""
    argv = [a.replace("%d", credentials_dir) for a in shlex.split(exec_start)]
    assert argv[0].endswith("/bin/tt-serve") and argv[1] == "serve"
    return argv[2:]


def parse_serve(argv: list[str]) -> ServeConfig:
    parser = argparse.ArgumentParser(prog="tt-serve serve", exit_on_error=False)
    add_serve_arguments(parser)
    return ServeConfig.from_args(parser.parse_args(argv))


def test_disabled_module_defines_nothing() -> None:
    out = eval_module_stub({})
    assert out["problems"] == []
    assert out["execStart"] is None and out["failedAssertions"] == []
    assert out["firewallPorts"] is None


def test_options_are_the_documented_set() -> None:
    options = set(eval_module_stub({})["options"])
    assert {
        "enable", "package", "model", "host", "port", "openFirewall", "backend", "device",
        "deviceIds", "deviceResident", "deviceArgmax", "tracedPrefill", "prefillChunk",
        "blockSize", "kvBlocks", "prefixCaching", "maxBatchSize", "apiKeyFile", "extraArgs",
        "environment", "hugepages", "dtype", "precision", "maxModelLen", "maxWaiting",
        "maxNumBatchedTokens", "servedModelName", "logLevel", "kernelDriver", "preStartCheck",
        "startTimeoutMinutes",
    } <= options  # fmt: skip


def test_module_only_defaults_equal_host_defaults_nix() -> None:
    """hugepages, kernelDriver, preStartCheck and startTimeoutMinutes take their defaults from
    modules/lib/host-defaults.nix (not ServeConfig: they are no `tt-serve serve` flags)."""
    host_defaults = nix_eval_json("import ./modules/lib/host-defaults.nix")
    assert eval_module_stub({})["hostSettings"] == host_defaults
    changed = {"kernelDriver": {"enable": False}, "startTimeoutMinutes": 5}
    assert eval_module_stub(changed)["hostSettings"] == {**host_defaults, **changed}


def test_every_serve_setting_is_an_option() -> None:
    options = set(eval_module_stub({})["options"])
    assert set(ServeConfig().to_json_dict()) <= options


def _words(text: str) -> str:
    return " ".join(text.split()).lower()


def test_new_options_types_and_descriptions() -> None:
    info = eval_module_stub({})["optionInfo"]
    assert info["precision"]["type"] == "one of " + ", ".join(f'"{p}"' for p in PRECISIONS)
    assert info["maxModelLen"]["type"] == "signed integer"
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(ServeConfig)}
    assert _words(helps["precision"]) in _words(info["precision"]["description"])
    assert _words(helps["max_model_len"]) in _words(info["maxModelLen"]["description"])


def test_every_flag_is_passed_explicitly() -> None:
    """Each `tt-serve serve` flag (one per ServeConfig field) is on the command line, so CLI
    defaults never leak into a deployment."""
    out = eval_module_stub({"enable": True, **EXAMPLE_HOST})
    argv = serve_argv(out["execStart"])
    named = [a.removeprefix("--") for a in argv if a.startswith("--")]
    given = {n.removeprefix("no-") for n in named}  # --no-device-argmax names device-argmax
    flags = {f.name.replace("_", "-") for f in serve_flag_fields()}
    assert flags <= given, flags - given
    assert argv[argv.index("--precision") + 1] == "mixed"
    assert argv[argv.index("--max-model-len") + 1] == "32768"


def test_defaults_execstart_and_hardening() -> None:
    out = eval_module_stub({"enable": True})
    assert out["problems"] == [] and out["failedAssertions"] == []
    assert parse_serve(serve_argv(out["execStart"])) == ServeConfig()
    sc = out["serviceConfig"]
    assert sc["DynamicUser"] is True and sc["ProtectSystem"] == "strict"
    assert sc["NoNewPrivileges"] is True and sc["PrivateTmp"] is True
    assert sc["Restart"] == "on-failure"
    assert sc["PrivateDevices"] is True and sc["DeviceAllow"] == []  # CPU: no devices
    assert out["execStartPost"].endswith(" http://127.0.0.1:8000/health")
    assert out["firewallPorts"] is None and out["kernelParams"] is None


def test_ttnn_host_wiring() -> None:
    out = eval_module_stub({"enable": True, **EXAMPLE_HOST})
    assert out["problems"] == [] and out["failedAssertions"] == []
    assert out["firewallPorts"] == [8000]
    sc = out["serviceConfig"]
    assert sc["DeviceAllow"] == ["char-tenstorrent rw"] and sc["PrivateDevices"] is False
    assert sc["LoadCredential"] == ["api-key:/run/keys/api key"]
    assert sc["ReadWritePaths"] == ["/dev/hugepages-1G", "/var/cache/tt-serve"]  # + disk tier
    assert out["kernelParams"] == ["hugepagesz=1G", "hugepages=4"]
    assert out["mounts"] == ["/dev/hugepages-1G"]
    assert 'SUBSYSTEM=="tenstorrent"' in out["udevRules"]
    # 0.0.0.0 is probed on loopback
    assert out["execStartPost"].endswith(" http://127.0.0.1:8000/health")


def test_ttnn_unit_points_the_runtime_at_sfpi_and_the_cache() -> None:
    out = eval_module_stub({"enable": True, **EXAMPLE_HOST})
    env, sc = out["environment"], out["serviceConfig"]
    # stub-nixpkgs/pkgs.nix gives tt-serve the passthru nix/package.nix has (ttnnRuntimeRoot).
    assert env["TT_METAL_RUNTIME_ROOT"].endswith("-ttnn-stub/lib/python3.12/site-packages/ttnn")
    assert env["TT_METAL_CACHE"] == f"/var/cache/{sc['CacheDirectory']}"
    assert env["TT_METAL_LOGS_PATH"] == f"/var/log/{sc['LogsDirectory']}"
    assert env["HOME"] == sc["WorkingDirectory"] == f"/var/lib/{sc['StateDirectory']}"
    assert sc["LimitMEMLOCK"] == "infinity" and sc["SupplementaryGroups"] == ["tenstorrent"]
    # The tt-kmd recipe, built with the host's kernel package set, with its udev rules.
    assert out["extraModulePackages"] == ["kmod-tt-kmd.nix"]
    assert out["udevPackages"] == ["kmod-tt-kmd.nix"] and out["kernelModules"] == ["tenstorrent"]
    assert out["warnings"] is None


def test_host_provided_driver_is_a_warning_naming_the_version() -> None:
    out = eval_module_stub({"enable": True, "backend": "ttnn", "kernelDriver": {"enable": False}})
    assert out["extraModulePackages"] is None and out["udevPackages"] is None
    (warning,) = out["warnings"]
    assert "tt-kmd >= 2.0.0" in warning and "/dev/tenstorrent/N" in warning


def test_torch_unit_has_no_tenstorrent_runtime() -> None:
    out = eval_module_stub({"enable": True})
    assert not [k for k in out["environment"] if k.startswith("TT_METAL_")]
    assert out["extraModulePackages"] is None and out["warnings"] is None


@pytest.mark.parametrize(
    ("settings", "compiler"),
    [({}, True), ({"device": "cuda"}, False), ({"backend": "ttnn"}, False)],
)
def test_a_cpu_torch_unit_has_a_compiler_for_its_kernels(
    settings: dict[str, str], compiler: bool
) -> None:
    """native.c is compiled at the first start with the compiler in the unit's PATH; only the
    torch backend on the CPU runs it."""
    out = eval_module_stub({"enable": True, **settings})
    path = out["units"]["tenstorrent-serving"]["path"]
    assert (path == ["gcc-wrapper-stub", "binutils-wrapper-stub"]) is compiler
    assert compiler or path == []


def test_start_timeout_covers_the_health_wait() -> None:
    for minutes in (60, 7):
        out = eval_module_stub({"enable": True, "backend": "ttnn", "startTimeoutMinutes": minutes})
        assert out["serviceConfig"]["TimeoutStartSec"] == f"{minutes}min"
        probe = shlex.split(out["execStartPost"])
        retries = int(probe[probe.index("--retry") + 1])
        delay = int(probe[probe.index("--retry-delay") + 1])
        assert retries * delay >= minutes * 60  # curl keeps polling until systemd gives up


@pytest.mark.parametrize(
    ("backend", "code"), [pytest.param("torch", 0, marks=pytest.mark.slow), ("ttnn", 1)]
)
def test_pre_start_doctor_runs_with_the_units_argv(backend: str, code: int) -> None:
    """ExecStartPre= is `tt-serve doctor` for the unit's backend and devices; run here through
    the real CLI it passes for torch on the CPU and fails for ttnn (no device on this host)."""
    if backend == "ttnn" and Path("/dev/tenstorrent").exists():
        pytest.skip("this host has Tenstorrent devices")
    settings = {"enable": True, "backend": backend, "deviceIds": [0]}
    (pre,) = eval_module_stub(settings)["execStartPre"]
    argv = shlex.split(pre)
    assert argv[0].endswith("/bin/tt-serve") and argv[1:3] == ["doctor", "--backend"]
    cli = "import sys; from tt_serve.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", cli, *argv[1:]],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert eval_module_stub({**settings, "preStartCheck": False})["execStartPre"] == []


def test_argv_is_accepted_by_the_real_parser() -> None:
    settings = {**EXAMPLE_HOST, "port": 8443, "logLevel": "debug"}
    out = eval_module_stub({"enable": True, **settings})
    cfg = parse_serve(serve_argv(out["execStart"], "/run/credentials/tenstorrent-serving.service"))
    expected = config_from_json_dict(
        {**settings, "apiKeyFile": "/run/credentials/tenstorrent-serving.service/api-key"}
    )
    assert cfg == expected
    assert validate(cfg) == []
    assert dry_run(cfg, out=open("/dev/null", "w")) == 0  # noqa: SIM115


def test_extra_args_come_last_and_quoted() -> None:
    out = eval_module_stub({"enable": True, "extraArgs": ["--max-waiting", "7"]})
    argv = serve_argv(out["execStart"])
    assert argv[-2:] == ["--max-waiting", "7"]
    assert parse_serve(argv).max_waiting == 7


def test_systemd_specials_are_escaped() -> None:
    out = eval_module_stub({"enable": True, "model": '/m/100%"$HOME"'})
    assert '"/m/100%%\\"$$HOME\\""' in out["execStart"]


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"deviceResident": True, "deviceArgmax": False, "backend": "ttnn"},
         f"{P}.deviceResident = true requires {P}.deviceArgmax = true"),
        ({"backend": "ttnn", "maxBatchSize": 64}, f"{P}.maxBatchSize must be in 0..32"),
        ({"prefillChunk": 96, "blockSize": 32}, "GDN chunk (64)"),
        ({"backend": "ttnn", "dtype": "float32"}, f"{P}.dtype = float32 is not available"),
        ({"precision": "mixed", "device": "cuda"}, f"{P}.precision = mixed on backend torch"),
        ({"kvBlocks": 1}, f"{P}.kvBlocks must be 0 (size from memory) or at least 2"),
        ({"maxModelLen": -1}, f"{P}.maxModelLen must not be negative"),
        ({"prefillChunk": 96, "blockSize": 64, "prefixCaching": {"enable": False}},
         f"{P}.prefillChunk (96) must be a multiple of {P}.blockSize (64)"),
    ],
)  # fmt: skip
def test_failed_assertions_reach_the_module(settings: dict[str, Any], needle: str) -> None:
    out = eval_module_stub({"enable": True, **settings})
    assert any(needle in m for m in out["failedAssertions"]), out["failedAssertions"]
    assert out["failedAssertions"] == validate(config_from_json_dict(settings))


def test_type_errors_and_unknown_options_are_reported() -> None:
    out = eval_module_stub(
        {"enable": True, "port": 70000, "bogus": 1, "backend": "cuda", "precision": "fp8"}
    )
    problems = "\n".join(out["problems"])
    for option in ("port", "backend", "precision"):
        assert f"A definition for option `{P}.{option}' is not of type" in problems
    assert f"The option `{P}.bogus' does not exist." in out["problems"]
    # Module disabled: the stand-in would otherwise evaluate the assertions on "4k" and stop.
    problems = "\n".join(eval_module_stub({"maxModelLen": "4k"})["problems"])
    assert f"A definition for option `{P}.maxModelLen' is not of type `signed integer'" in problems


@pytest.mark.skipif(
    importlib.util.find_spec("tt_serve.cli") is None, reason="tt_serve.cli not present yet"
)
def test_cli_dry_run_accepts_the_module_argv() -> None:
    out = eval_module_stub({"enable": True, **EXAMPLE_HOST, "apiKeyFile": None})
    argv = serve_argv(out["execStart"])
    code = "import sys; from tt_serve.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", code, "serve", *argv, "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    expected = config_from_json_dict({**EXAMPLE_HOST, "apiKeyFile": None}).to_json_dict()
    assert json.loads(result.stdout) == expected
