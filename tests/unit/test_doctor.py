"""tt-serve doctor: the real CLI on this machine (no Tenstorrent device) and every check on a
fake host tree (tmp_path standing in for /), where each piece can be present or broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tt_serve.doctor import FAIL, OK, WARN, Host, ttnn_checks

ROOT = Path(__file__).resolve().parents[2]
# SFPI's g++ is an x86-64 ELF executable; doctor reads the first bytes only.
ELF_HEADER = b"\x7fELF\x02\x01\x01" + bytes(57)
TTNN_PYTHON = Path(os.environ.get("TTNN_VENV", ROOT / ".venv-ttnn")) / "bin" / "python"
NEEDED = ("device nodes", "kernel driver", "huge pages", "SFPI compiler")
no_device_here = pytest.mark.skipif(
    Path("/dev/tenstorrent").exists(), reason="this host has Tenstorrent devices"
)


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from tt_serve.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TT_METAL")}
    return subprocess.run(
        [sys.executable, "-c", code, "doctor", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip


def statuses(out: str) -> dict[str, str]:
    checks = json.loads(out)["checks"]
    return {c["name"]: c["status"] for c in checks}


@no_device_here
def test_ttnn_here_fails_naming_every_missing_piece() -> None:
    proc = doctor("--backend", "ttnn")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    for name in NEEDED:
        assert f"[FAIL] {name}:" in proc.stdout, proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1].startswith("serving would fail: ")
    as_json = doctor("--backend", "ttnn", "--json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["ok"] is False
    assert all(statuses(as_json.stdout)[n] == FAIL for n in NEEDED)


@no_device_here
def test_ttnn_with_the_real_wheel_names_the_sfpi_it_needs() -> None:
    if not TTNN_PYTHON.exists():
        reason = f"no ttnn venv at {TTNN_PYTHON.parent.parent} (run scripts/setup-ttnn-venv)"
        if os.environ.get("REQUIRE_TTNN") == "1":
            pytest.fail(reason + "; REQUIRE_TTNN=1")
        pytest.skip(reason)
    proc = doctor("--backend", "ttnn", "--python", str(TTNN_PYTHON), "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["ttnn"]["status"] == OK and checks["ttnn"]["detail"].startswith("0.81.1 ")
    sfpi = checks["SFPI compiler"]
    assert sfpi["status"] == FAIL
    assert "ttnn/runtime/sfpi/compiler/bin/riscv-tt-elf-g++" in sfpi["detail"]
    assert "SFPI 7.89.0" in sfpi["fix"]  # read from the wheel's ttnn/tt_metal/sfpi-version
    if "mock-box stand-in" in sfpi["detail"]:  # the venv scripts/setup-ttnn-venv builds
        assert "compiles nothing" in sfpi["detail"]
    else:  # a bare ttnn venv: nothing at either place
        assert "/opt/tenstorrent/sfpi/compiler/bin/riscv-tt-elf-g++" in sfpi["detail"]


@pytest.mark.slow
def test_torch_cpu_is_ready() -> None:
    proc = doctor("--backend", "torch")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("ready to serve")
    as_json = json.loads(doctor("--backend", "torch", "--json").stdout)
    assert as_json["ok"] is True and {"python", "torch", "cpu", "cuda"} <= set(statuses(
        json.dumps(as_json)))  # fmt: skip


@pytest.mark.slow
def test_torch_cpu_names_its_c_kernels_and_why_they_are_off() -> None:
    """The C kernels are a speed-up, never a requirement: compiled, OK; off, a warning naming
    why, and the server is still ready."""
    from tt_serve.model.kernels import native

    want = OK if native.kernels() is not None else WARN
    checks = json.loads(doctor("--backend", "torch", "--json").stdout)["checks"]
    assert {c["name"]: c["status"] for c in checks}["C kernels"] == want
    env = {**os.environ, "TT_SERVE_NATIVE": "0"}
    code = "import sys; from tt_serve.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, "doctor", "--backend", "torch"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 0 and "[WARN] C kernels: native kernels off (TT_SERVE_NATIVE=0)" in (
        proc.stdout
    )


@pytest.mark.slow
def test_torch_missing_cuda_device_fails_without_traceback() -> None:
    proc = doctor("--backend", "torch", "--device", "cuda:7")
    assert proc.returncode == 1 and "[FAIL] cuda:" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


SFPI_VERSION_FILE = "sfpi_version='7.89.0'\nsfpi_build='1050'\n"


def fake_host(tmp: Path, *, kmd: str = "2.10.0", sfpi: str = "7.89.0") -> tuple[Host, Any]:
    (tmp / "dev/tenstorrent").mkdir(parents=True)
    (tmp / "dev/tenstorrent/0").write_text("")
    (tmp / "sys/module/tenstorrent").mkdir(parents=True)
    (tmp / "sys/module/tenstorrent/version").write_text(kmd + "\n")
    pages = tmp / "sys/kernel/mm/hugepages/hugepages-1048576kB"
    pages.mkdir(parents=True)
    (pages / "nr_hugepages").write_text("4\n")
    (pages / "free_hugepages").write_text("4\n")
    (tmp / "dev/hugepages-1G").mkdir()
    (tmp / "proc").mkdir()
    (tmp / "proc/mounts").write_text(
        "hugetlbfs /dev/hugepages-1G hugetlbfs rw,pagesize=1024M 0 0\n"
    )
    pkg = tmp / "site-packages/ttnn"
    (pkg / "tt_metal").mkdir(parents=True)
    (pkg / "tt_metal/sfpi-version").write_text(SFPI_VERSION_FILE)
    gxx = pkg / "runtime/sfpi/compiler/bin/riscv-tt-elf-g++"
    gxx.parent.mkdir(parents=True)
    gxx.write_bytes(ELF_HEADER)
    (pkg / "runtime/sfpi/sfpi.version").write_text(sfpi + "\n")
    facts = {"python": "3.12.1", "version": "0.81.1", "package_dir": str(pkg), "root": str(pkg)}
    host = Host(root=tmp, env={"TT_METAL_CACHE": str(tmp / "cache"), "HOME": str(tmp)})
    return host, facts


def run_fake(host: Host, facts: Any, ids: tuple[int, ...] = (0,)) -> dict[str, tuple[str, str]]:
    checks = ttnn_checks(host, ids, "python3.12", probe=lambda _py: facts)
    return {c.name: (c.status, c.detail) for c in checks}


def test_fake_host_with_everything_in_place_is_ready(tmp_path: Path) -> None:
    host, facts = fake_host(tmp_path)
    result = run_fake(host, facts)
    assert {name: s for name, (s, _) in result.items()} == {
        "python": OK, "ttnn": OK, "device nodes": OK, "kernel driver": OK, "huge pages": OK,
        "memlock limit": OK, "SFPI compiler": OK, "kernel cache": OK, "mock mode": OK,
    }  # fmt: skip
    assert "tt-kmd 2.10.0" in result["kernel driver"][1]
    assert (tmp_path / "cache").is_dir()  # the cache check made (and wrote into) the folder


def test_fake_host_each_broken_piece_is_named(tmp_path: Path) -> None:
    host, facts = fake_host(tmp_path, kmd="1.29", sfpi="7.88.0")
    result = run_fake(host, facts, ids=(0, 3))
    assert result["kernel driver"][0] == FAIL and "needs >= 2.0.0" in result["kernel driver"][1]
    assert result["SFPI compiler"][0] == FAIL
    assert "7.88.0" in result["SFPI compiler"][1] and "7.89.0" in result["SFPI compiler"][1]
    assert result["device nodes"][0] == FAIL and "[3] missing" in result["device nodes"][1]


def test_fake_host_hugepages_missing_is_fatal_only_without_iommu(tmp_path: Path) -> None:
    host, facts = fake_host(tmp_path)
    (tmp_path / "proc/mounts").write_text("")
    assert run_fake(host, facts)["huge pages"][0] == FAIL
    (tmp_path / "sys/kernel/iommu_groups/0").mkdir(parents=True)
    assert run_fake(host, facts)["huge pages"][0] == WARN


def test_fake_host_runtime_root_and_system_sfpi(tmp_path: Path) -> None:
    """TT_METAL_RUNTIME_ROOT moves where runtime/sfpi is looked for; /opt is the fallback."""
    host, facts = fake_host(tmp_path)
    facts = {**facts, "root": str(tmp_path / "elsewhere")}
    assert run_fake(host, facts)["SFPI compiler"][0] == FAIL
    opt = tmp_path / "opt/tenstorrent/sfpi"
    (opt / "compiler/bin").mkdir(parents=True)
    (opt / "compiler/bin/riscv-tt-elf-g++").write_bytes(ELF_HEADER)
    (opt / "sfpi.version").write_text("7.89.0\n")
    status, detail = run_fake(host, facts)["SFPI compiler"]
    assert status == OK and detail.startswith(str(opt))


def test_doctor_fails_on_the_mock_box_stand_in_compiler(tmp_path: Path) -> None:
    """The stand-in scripts/mock-sfpi installs (test and plan venvs) passes tt-metal's search
    for SFPI; on a host it would give every kernel an empty body, so doctor refuses it, and any
    other non-ELF file, even with the right sfpi.version beside it."""
    host, facts = fake_host(tmp_path)
    package = tmp_path / "ttnn"
    (package / "runtime").mkdir(parents=True)
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mock-sfpi"), "install", str(package)],
        check=True,
        capture_output=True,
    )
    (package / "runtime/sfpi/sfpi.version").write_text("7.89.0\n")
    facts = {**facts, "root": str(package)}
    status, detail = run_fake(host, facts)["SFPI compiler"]
    assert status == FAIL and "mock-box stand-in" in detail and "compiles nothing" in detail
    gxx = package / "runtime/sfpi/compiler/bin/riscv-tt-elf-g++"
    gxx.write_text("#!/bin/sh\nexit 0\n")
    status, detail = run_fake(host, facts)["SFPI compiler"]
    assert status == FAIL and "not an ELF executable" in detail
    gxx.write_bytes(ELF_HEADER)
    assert run_fake(host, facts)["SFPI compiler"][0] == OK


def test_doctor_fails_where_a_mock_box_or_the_trace_shim_would_be_used(tmp_path: Path) -> None:
    """tests/tt/mock and `tt-serve plan` run tt-metal on simulated boxes, with the trace shim
    preloaded; on a host either would make serving a pretence, so doctor names both."""
    host, facts = fake_host(tmp_path)
    env = dict(host.env or {})
    shim = "/venv/lib/tt-serve-mock-trace.so"
    for extra, named in (
        ({"TT_METAL_MOCK_CLUSTER_DESC_PATH": "/tmp/p150.yaml"}, ["simulated box"]),
        ({"LD_PRELOAD": shim}, ["mock-box trace shim"]),
        (
            {"TT_METAL_MOCK_CLUSTER_DESC_PATH": "/tmp/p150.yaml", "LD_PRELOAD": f"/x.so:{shim}"},
            ["simulated box", "mock-box trace shim"],
        ),
    ):
        status, detail = run_fake(Host(root=tmp_path, env={**env, **extra}), facts)["mock mode"]
        assert status == FAIL and all(n in detail for n in named), detail
    status, _ = run_fake(Host(root=tmp_path, env={**env, "LD_PRELOAD": "/x.so"}), facts)[
        "mock mode"
    ]
    assert status == OK


def test_unwritable_cache_fails(tmp_path: Path) -> None:
    host, facts = fake_host(tmp_path)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    host = Host(root=tmp_path, env={"TT_METAL_CACHE": str(blocker / "cache")})
    assert run_fake(host, facts)["kernel cache"][0] == FAIL


def test_damaged_kernel_files_are_findings_not_a_crash(tmp_path: Path) -> None:
    """A non-number in nr_hugepages or bytes that are not UTF-8 used to raise inside one check
    and turn the whole report into a single 'internal error'."""
    host, facts = fake_host(tmp_path)
    pages = tmp_path / "sys/kernel/mm/hugepages/hugepages-1048576kB"
    (pages / "nr_hugepages").write_text("garbage\n")
    (tmp_path / "proc/mounts").write_bytes(b"\xff\xfe not utf-8\n")
    (tmp_path / "sys/module/tenstorrent/version").write_bytes(b"\xff\xfe")
    result = run_fake(host, facts)
    assert result["huge pages"][0] == FAIL and "0 1 GiB huge pages" in result["huge pages"][1]
    assert result["kernel driver"][0] == FAIL
    assert result["device nodes"][0] == OK and result["SFPI compiler"][0] == OK


def test_negative_or_empty_device_ids_are_usage_errors() -> None:
    for ids in ("-1", ","):
        proc = doctor("--backend", "ttnn", "--device-ids", ids)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "--device-ids" in proc.stderr


@pytest.mark.slow
def test_output_into_a_closed_pipe_is_not_a_traceback() -> None:
    code = "import sys; from tt_serve.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "doctor", "--json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # `tt-serve doctor --json | head -0`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err
