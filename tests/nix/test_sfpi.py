"""The SFPI and tt-kmd pins against what the real ttnn 0.81.1 wheel records, and the Nix recipes
that use them (evaluated with stand-in arguments: nothing is fetched or built here).

The wheel's ttnn/tt_metal/sfpi-version names the SFPI release and the sha256 of each asset;
sfpi-info.sh (next to it in tt-llk) builds the asset URL as
<sfpi_repo>/releases/download/<sfpi_version>/sfpi_<version>_<arch>_<dist>.<pkg>. A ttnn bump
that changes either fails here. Without the ttnn venv these tests skip, unless REQUIRE_TTNN=1.
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import pytest

from tests.nix.nixtools import ROOT, nix_eval_json
from tt_serve import doctor

VENV = Path(os.environ.get("TTNN_VENV", ROOT / ".venv-ttnn"))
PINS = json.loads((ROOT / "nix" / "pins.json").read_text())


def wheel_sfpi_text() -> str:
    found = sorted(VENV.glob("lib/python3*/site-packages/ttnn/tt_metal/sfpi-version"))
    if not found:
        reason = f"no ttnn wheel in {VENV} (run scripts/setup-ttnn-venv)"
        if os.environ.get("REQUIRE_TTNN") == "1":
            pytest.fail(reason + "; REQUIRE_TTNN=1")
        pytest.skip(reason)
    return found[0].read_text()


def parse_sfpi_version(text: str) -> dict[str, str]:
    return dict(re.findall(r"^(sfpi_\w+)='([^']*)'", text, re.MULTILINE))


def expected_pin(text: str) -> dict[str, str]:
    """The x86_64 Debian txz asset, as sfpi-info.sh names it, with the wheel's hash as SRI."""
    v = parse_sfpi_version(text)
    assert v["sfpi_hashtype"] == "sha256"
    filename = f"sfpi_{v['sfpi_version']}_x86_64_debian.txz"
    digest = base64.b64encode(bytes.fromhex(v["sfpi_x86_64_debian_txz_hash"])).decode()
    return {
        "version": v["sfpi_version"],
        "build": v["sfpi_build"],
        "filename": filename,
        "url": f"{v['sfpi_repo']}/releases/download/{v['sfpi_version']}/{filename}",
        "hash": f"sha256-{digest}",
    }


def pin_differences(pin: dict[str, str], text: str) -> list[str]:
    want = expected_pin(text)
    return [
        f"{k}: pinned {pin.get(k)!r}, wheel says {w!r}" for k, w in want.items() if pin.get(k) != w
    ]


def test_sfpi_pin_equals_the_wheels_sfpi_version() -> None:
    assert pin_differences(PINS["sfpi"], wheel_sfpi_text()) == []


def test_a_drifted_pin_is_reported() -> None:
    text = wheel_sfpi_text()
    assert pin_differences({**PINS["sfpi"], "version": "7.88.0"}, text) == [
        f"version: pinned '7.88.0', wheel says {parse_sfpi_version(text)['sfpi_version']!r}"
    ]
    bumped = text.replace("sfpi_x86_64_debian_txz_hash='de16", "sfpi_x86_64_debian_txz_hash='ee16")
    assert [d.split(":")[0] for d in pin_differences(PINS["sfpi"], bumped)] == ["hash"]


def test_the_wheel_has_the_folder_sfpi_is_linked_into() -> None:
    """The wheel ships runtime/ without sfpi/ (the Nix recipe links SFPI there; in the test venv
    scripts/mock-sfpi puts its stand-in there, which the wheel's RECORD does not list)."""
    wheel_sfpi_text()
    (pkg,) = VENV.glob("lib/python3*/site-packages/ttnn")
    (record,) = VENV.glob("lib/python3*/site-packages/ttnn-*.dist-info/RECORD")
    shipped = [ln.split(",")[0] for ln in record.read_text().splitlines()]
    assert (pkg / "runtime").is_dir() and any(f.startswith("ttnn/runtime/") for f in shipped)
    assert not [f for f in shipped if f.startswith("ttnn/runtime/sfpi/")]


def test_the_wheels_runtime_reads_what_the_unit_and_doctor_use() -> None:
    """The search paths and variables named by nix/sfpi.nix, modules/lib/runtime.nix and
    tt_serve/doctor.py appear as strings in the wheel's libtt_metal.so."""
    wheel_sfpi_text()
    (lib,) = VENV.glob("lib/python3*/site-packages/ttnn/build/lib/libtt_metal.so")
    data = lib.read_bytes()
    env = nix_eval_json(
        '(import ./modules/lib/runtime.nix).environment { ttnn = true; runtimeRoot = "/r"; }'
    )
    names = [n for n in env if n.startswith("TT_METAL_")]
    assert sorted(names) == ["TT_METAL_CACHE", "TT_METAL_LOGS_PATH", "TT_METAL_RUNTIME_ROOT"]
    for needle in [*names, "runtime/sfpi", doctor.SYSTEM_SFPI, "/" + doctor.SFPI_GXX]:
        assert needle.encode() + b"\0" in data, needle


# Stand-in arguments (each recipe takes the ones it declares): a recipe returns the attribute
# set it would hand to its builder.
STUB_ARGS = """
  lib = { licenses = { asl20 = 1; gpl3Plus = 1; gpl2Only = 1; }; sourceTypes.binaryNativeCode = 1;
          platforms.linux = [ ]; optional = c: x: if c then [ x ] else [ ]; };
  stdenv = { mkDerivation = f: if builtins.isFunction f then f { buildFlags = [ ]; } else f;
             cc.cc.lib = "cclib"; };
  fetchurl = a: a // { fetcher = "fetchurl"; };
  fetchzip = a: a // { fetcher = "fetchzip"; };
  autoPatchelfHook = "autoPatchelfHook";
"""


def eval_recipe(file: str, args: str, attrs: str) -> dict[str, object]:
    expr = f"""let f = import ./nix/{file}; given = {{ {STUB_ARGS} {args} }};
      r = f (builtins.intersectAttrs (builtins.functionArgs f) given);
      in builtins.intersectAttrs (builtins.listToAttrs (map (n: {{ name = n; value = 0; }})
        [ {attrs} ])) r"""
    out: dict[str, object] = nix_eval_json(expr)
    return out


def test_sfpi_recipe_fetches_the_pin_and_checks_the_compiler() -> None:
    names = '"pname" "version" "src" "sourceRoot" "dontStrip" "installCheckPhase" "passthru"'
    none = " ".join(
        f"{n} = null;" for n in ("xz", "zlib", "zstd", "gmp", "mpfr", "libmpc", "expat", "ncurses")
    )
    r = eval_recipe("sfpi.nix", none, names)
    pin = PINS["sfpi"]
    assert r["src"] == {"url": pin["url"], "hash": pin["hash"], "fetcher": "fetchurl"}
    assert (r["pname"], r["version"], r["passthru"]) == (
        "sfpi",
        pin["version"],
        {"build": pin["build"]},
    )
    assert r["sourceRoot"] == "sfpi" and r["dontStrip"] is True
    check = str(r["installCheckPhase"])
    assert "$out/compiler/bin/riscv-tt-elf-g++" in check and pin["version"] in check


def test_ttnn_recipe_links_sfpi_where_tt_metal_looks() -> None:
    args = """buildPythonPackage = a: a; sfpi = "/nix/store/x-sfpi"; zlib = null;
      python = { sitePackages = "lib/python3.12/site-packages"; pythonVersion = "3.12"; };
      numpy = 1; loguru = 1; networkx = 1; graphviz = 1; pyyaml = 1; click = 1; pandas = 1;
      seaborn = 1; ml-dtypes = 1;"""
    r = eval_recipe("ttnn.nix", args, '"postInstall" "passthru"')
    assert r["passthru"] == {"sfpi": "/nix/store/x-sfpi"}
    link = "ln -s /nix/store/x-sfpi $out/lib/python3.12/site-packages/ttnn/runtime/sfpi"
    assert link in str(r["postInstall"])


def test_tt_kmd_recipe_fetches_the_pin_and_meets_umds_minimum() -> None:
    args = """kernel = { moduleBuildDependencies = [ ]; dev = "/k"; modDirVersion = "6.12.0"; };"""
    r = eval_recipe("tt-kmd.nix", args, '"src" "version" "buildFlags" "postInstall"')
    pin = PINS["tt-kmd"]
    assert r["src"] == {"url": pin["url"], "hash": pin["hash"], "fetcher": "fetchzip"}
    assert pin["url"].endswith(f"/ttkmd-{pin['version']}.tar.gz")
    assert r["buildFlags"] == ["KDIR=/k/lib/modules/6.12.0/build"]
    assert "udev-50-tenstorrent.rules" in str(r["postInstall"])
    minimum = nix_eval_json("(import ./modules/lib/runtime.nix).kmdMinimum")
    assert tuple(int(x) for x in minimum.split(".")) == doctor.KMD_MINIMUM
    assert tuple(int(x) for x in pin["version"].split(".")) >= doctor.KMD_MINIMUM
