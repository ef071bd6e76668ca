"""The flake's outputs evaluate offline, with the nixpkgs input replaced by the stand-in
(tests/nix/stub-nixpkgs), and no flake.lock is written.

`nix eval .#...` in a git checkout sees only files git knows, so the flake's files are copied
into a scratch git repository (git init; git add -A; no commit) and evaluated there. The
stand-in cannot build packages or run real NixOS evaluation: packages, devShells, checks and
formatter are checked by name only; `nixosConfigurations.example` goes through the stand-in
module evaluator (see stub-nixpkgs/eval-modules.nix for what that leaves out).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.nix.nixtools import FLAKE_FLAGS, ROOT, nix_tool, repo_files, run
from tests.nix.test_module_stub import parse_serve, serve_argv
from tt_serve.config import config_from_json_dict, validate

FLAKE_PARTS = ("flake.nix", "modules/", "nix/", "hosts/", "tests/nix/stub-nixpkgs/")


@pytest.fixture(scope="module")
def flake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nix_tool("nix")
    dest = tmp_path_factory.mktemp("flake")
    for rel in repo_files():
        if rel.startswith(FLAKE_PARTS) or rel in {"pyproject.toml", "README.md"}:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    return dest


def flake_eval(flake_dir: Path, attr: str, apply: str | None = None) -> Any:
    cmd = [nix_tool("nix"), "eval", *FLAKE_FLAGS, "--json"]
    cmd += ["--override-input", "nixpkgs", "path:./tests/nix/stub-nixpkgs", f".#{attr}"]
    result = run([*cmd, *(["--apply", apply] if apply else [])], cwd=flake_dir)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_output_names(flake_dir: Path) -> None:
    names = "builtins.attrNames"
    assert flake_eval(flake_dir, "nixosModules", names) == ["default", "tenstorrent-serving"]
    packages = flake_eval(flake_dir, "packages.x86_64-linux", names)
    assert {"default", "tt-serve", "tt-serve-torch", "tt-sfpi", "tt-kmd"} <= set(packages)
    assert flake_eval(flake_dir, "devShells.x86_64-linux", names) == ["default"]
    assert "example-host" in flake_eval(flake_dir, "checks.x86_64-linux", names)
    assert flake_eval(flake_dir, "formatter", names) == ["x86_64-linux"]
    assert flake_eval(flake_dir, "overlays.default", "builtins.isFunction") is True
    assert not (flake_dir / "flake.lock").exists()


def test_lib_outputs_match_python(flake_dir: Path) -> None:
    defaults = flake_eval(flake_dir, "lib.defaults")
    assert validate(config_from_json_dict(defaults)) == []
    pins = flake_eval(flake_dir, "lib.pins", "builtins.attrNames")
    assert {"ttnn", "sfpi", "tt-kmd"} <= set(pins)


def test_example_host(flake_dir: Path) -> None:
    host = "nixosConfigurations.example"
    assert flake_eval(flake_dir, f"{host}.stubProblems") == []
    failed = flake_eval(flake_dir, f"{host}.config.assertions", "map (a: a.message)")
    held = flake_eval(flake_dir, f"{host}.config.assertions", "map (a: a.assertion)")
    assert all(held), failed
    settings = flake_eval(
        flake_dir,
        f"{host}.config.services.tenstorrent-serving",
        'c: removeAttrs c [ "package" "enable" "openFirewall" "extraArgs" '
        '"environment" "hugepages" "kernelDriver" "preStartCheck" "startTimeoutMinutes" ]',
    )
    unit = f"{host}.config.systemd.services.tenstorrent-serving.serviceConfig"
    cfg = parse_serve(serve_argv(flake_eval(flake_dir, f"{unit}.ExecStart"), "/cred"))
    assert cfg == config_from_json_dict({**settings, "apiKeyFile": "/cred/api-key"})
    assert cfg.backend == "ttnn"
    ports = flake_eval(flake_dir, f"{host}.config.networking.firewall.allowedTCPPorts")
    assert ports == [settings["port"]]
    assert not (flake_dir / "flake.lock").exists()
