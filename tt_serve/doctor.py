"""``tt-serve doctor``: can this host serve with the chosen backend? Each check prints OK, WARN
(serving works, something is worth knowing) or FAIL (serving would fail) with what to do; the
exit status is 1 when any check fails.

What the ttnn checks look for, and where that comes from (ttnn 0.81.1, its UMD 0.9.14 and
tt-kmd 2.10.0; modules/lib/runtime.nix holds the same facts for the NixOS unit):

- device nodes ``/dev/tenstorrent/N``, made by the tt-kmd driver (UMD opens them);
- the driver: ``/sys/module/tenstorrent/version`` at least 2.0.0 (UMD's KMD_MINIMUM_VERSION);
- 1 GiB huge pages, reserved and mounted (hugetlbfs, pagesize=1G), one per device; with an
  active IOMMU UMD falls back to ordinary pages, so then their absence is only a warning;
- SFPI, the RISC-V compiler tt-metal's JIT runs: ``<root>/runtime/sfpi`` or
  ``/opt/tenstorrent/sfpi``, where ``<root>`` is TT_METAL_RUNTIME_ROOT or the ttnn package folder
  (ttnn's ``__init__``); its ``sfpi.version`` must equal the wheel's ``tt_metal/sfpi-version``;
- the kernel cache, TT_METAL_CACHE (else ``$HOME/.cache``): writable, or every start fails;
- memlock is reported only: tt-kmd pins DMA buffers without charging RLIMIT_MEMLOCK.

ttnn is imported only in a subprocess: several of its entry points abort the process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

KMD_MINIMUM = (2, 0, 0)
TTNN_VERSION = "0.81.1"
SFPI_GXX = "compiler/bin/riscv-tt-elf-g++"
SYSTEM_SFPI = "/opt/tenstorrent/sfpi"
# The first lines of scripts/mock-sfpi's stand-in compiler carry this (doctor fails on it).
STANDIN_MARK = "mock-box stand-in"
HUGEPAGES_1G = "sys/kernel/mm/hugepages/hugepages-1048576kB"
PROBE_TIMEOUT_S = 120
_MARK = "TT_DOCTOR "
# Mirrors tt-metal's ttnn/ttnn/__init__.py: the runtime root is TT_METAL_RUNTIME_ROOT, else the package folder
# (two levels up for an editable checkout, recognised by the path holding no site-packages).
_TTNN_PROBE = f"""
import importlib.metadata, json, os, sys
out = {{"python": sys.version.split()[0]}}
try:
    import ttnn
except BaseException as exc:
    out["error"] = type(exc).__name__ + ": " + str(exc)
else:
    pkg = os.path.dirname(os.path.abspath(ttnn.__file__))
    editable = "site-packages" not in pkg and "dist-packages" not in pkg
    out["version"] = importlib.metadata.version("ttnn")
    out["package_dir"] = pkg
    out["root"] = os.environ.get("TT_METAL_RUNTIME_ROOT") or (
        os.path.dirname(os.path.dirname(pkg)) if editable else pkg)
print({_MARK!r} + json.dumps(out), flush=True)
"""

OK, WARN, FAIL = "OK", "WARN", "FAIL"


@dataclass(frozen=True)
class Check:
    """One finding: ``fix`` says what to do when the status is not OK."""

    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Host:
    """Where the checks read the machine; ``root`` is ``/`` except in tests."""

    root: Path = Path("/")
    env: Mapping[str, str] | None = None

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def getenv(self, name: str) -> str | None:
        return (os.environ if self.env is None else self.env).get(name)


def _read(path: Path) -> str | None:
    try:  # kernel files are ASCII; a damaged one must not stop the other checks
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _count(path: Path) -> int:
    text = _read(path) or ""
    return int(text) if text.isdigit() else 0


def _version(text: str) -> tuple[int, ...] | None:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(g) for g in m.groups()) if m else None


def device_nodes(host: Host) -> list[int]:
    folder = host.path("/dev/tenstorrent")
    try:
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())
    except OSError:
        return []


def check_devices(host: Host, device_ids: Sequence[int]) -> Check:
    nodes = device_nodes(host)
    if not nodes:
        return Check("device nodes", FAIL, "no /dev/tenstorrent/N", _DRIVER_FIX)
    missing = [i for i in device_ids if i not in nodes]
    listed = ", ".join(f"/dev/tenstorrent/{n}" for n in nodes)
    if missing:
        return Check(
            "device nodes", FAIL, f"{len(nodes)} found ({listed}); ids {missing} missing",
            "pick --device-ids among the nodes found (NixOS: services.tenstorrent-serving.deviceIds)",
        )  # fmt: skip
    if not all(
        os.access(host.path(f"/dev/tenstorrent/{i}"), os.R_OK | os.W_OK) for i in device_ids
    ):
        return Check(
            "device nodes", FAIL, f"{listed}: not readable and writable by this user",
            "add the user to the group owning /dev/tenstorrent/* (the NixOS unit uses 'tenstorrent')",
        )  # fmt: skip
    return Check("device nodes", OK, f"{len(nodes)} found ({listed})")


_DRIVER_FIX = (
    "load the tt-kmd driver (>= 2.0.0): on NixOS services.tenstorrent-serving.kernelDriver.enable "
    "= true, elsewhere https://github.com/tenstorrent/tt-kmd (make dkms)"
)


def check_driver(host: Host) -> Check:
    module = host.path("/sys/module/tenstorrent")
    if not module.is_dir():
        return Check("kernel driver", FAIL, "tenstorrent module not loaded", _DRIVER_FIX)
    text = _read(module / "version") or "unknown"
    got = _version(text)
    need = ".".join(map(str, KMD_MINIMUM))
    if got is None or got < KMD_MINIMUM:
        return Check(
            "kernel driver", FAIL, f"tt-kmd {text} loaded; ttnn {TTNN_VERSION} needs >= {need}",
            _DRIVER_FIX,
        )  # fmt: skip
    return Check("kernel driver", OK, f"tt-kmd {text} (>= {need})")


def _hugetlbfs_1g_mounts(host: Host) -> list[str]:
    mounts = _read(host.path("/proc/mounts")) or ""
    found = []
    for line in mounts.splitlines():
        parts = line.split()
        hugetlbfs = len(parts) >= 4 and parts[2] == "hugetlbfs"
        if hugetlbfs and re.search(r"(^|,)pagesize=(1G|1024M)(,|$)", parts[3]):
            found.append(parts[1])
    return found


def _iommu_active(host: Host) -> bool:
    try:
        return any(host.path("/sys/kernel/iommu_groups").iterdir())
    except OSError:
        return False


def check_hugepages(host: Host, devices: int) -> Check:
    total = _count(host.path(f"/{HUGEPAGES_1G}/nr_hugepages"))
    free = _count(host.path(f"/{HUGEPAGES_1G}/free_hugepages"))
    mounts = _hugetlbfs_1g_mounts(host)
    need = max(devices, 1)
    problem = ""
    if total < need:
        problem = f"{total} 1 GiB huge pages reserved, {need} needed (one per device)"
    elif not mounts:
        problem = f"{total} reserved but no hugetlbfs mount with pagesize=1G"
    elif not any(os.access(host.path(m), os.W_OK) for m in mounts):
        problem = f"{', '.join(mounts)} not writable by this user"
    if problem:
        fix = (
            "boot with hugepagesz=1G hugepages=N and mount hugetlbfs pagesize=1G at "
            "/dev/hugepages-1G (NixOS: services.tenstorrent-serving.hugepages.enable)"
        )
        if _iommu_active(host):
            return Check(
                "huge pages", WARN, problem + "; IOMMU active, so UMD can use ordinary pages", fix
            )
        return Check("huge pages", FAIL, problem + "; no IOMMU, so UMD needs them", fix)
    status = OK if free >= need else WARN
    detail = f"{total} x 1 GiB reserved, {free} free, mounted at {', '.join(mounts)}"
    fix = "" if status == OK else "another process holds the huge pages: stop it before serving"
    return Check("huge pages", status, detail, fix)


def check_memlock() -> Check:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    shown = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} KiB"
    return Check(
        "memlock limit", OK, f"{shown} (tt-kmd pins DMA buffers without charging RLIMIT_MEMLOCK)"
    )


def probe_ttnn(python: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Facts about ttnn from a subprocess (import, version, runtime root); ``error`` on failure."""
    try:
        proc = subprocess.run(
            [python, "-c", _TTNN_PROBE],
            capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False,
            env=None if env is None else dict(env),
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"could not run {python}: {exc}"}
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            try:
                facts: dict[str, Any] = json.loads(line[len(_MARK) :])
            except ValueError:
                break
            return facts
    tail = (proc.stderr or proc.stdout).strip().splitlines()
    return {"error": tail[-1] if tail else f"exit status {proc.returncode}"}


def check_ttnn(facts: Mapping[str, Any]) -> Check:
    if "error" in facts:
        return Check(
            "ttnn", FAIL, f"import failed: {facts['error']}",
            f"install ttnn=={TTNN_VERSION} (Python 3.10 or 3.12) in the Python tt-serve runs",
        )  # fmt: skip
    version = str(facts["version"])
    if version != TTNN_VERSION:
        return Check(
            "ttnn", WARN, f"{version} at {facts['package_dir']}",
            f"tt-serve is built and tested against ttnn {TTNN_VERSION}",
        )  # fmt: skip
    return Check("ttnn", OK, f"{version} at {facts['package_dir']}")


def _sfpi_pin(package_dir: Path) -> str | None:
    text = _read(package_dir / "tt_metal" / "sfpi-version") or ""
    m = re.search(r"^sfpi_version='([^']+)'", text, re.MULTILINE)
    return m.group(1) if m else None


def _not_a_compiler(gxx: Path) -> str | None:
    """None for an ELF executable (SFPI's g++ is one); else what the file is instead. The
    mock-box stand-in (scripts/mock-sfpi, test and plan venvs only) says so in its first lines:
    tt-metal would run with it and every kernel it "built" would be empty on a card."""
    try:
        head = gxx.read_bytes()[:512]
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if head.startswith(b"\x7fELF"):
        return None
    if STANDIN_MARK.encode() in head:
        return (
            "the mock-box stand-in (scripts/mock-sfpi), which compiles nothing: kernels it "
            "builds would not run on a card"
        )
    return "not an ELF executable (a script or a placeholder, not SFPI's compiler)"


def check_sfpi(host: Host, facts: Mapping[str, Any]) -> Check:
    if "error" in facts:
        return Check("SFPI compiler", FAIL, "unknown: ttnn did not import", "fix ttnn first")
    root = Path(str(facts["root"]))
    want = _sfpi_pin(Path(str(facts["package_dir"])))
    candidates = [root / "runtime" / "sfpi", host.path(SYSTEM_SFPI)]
    fix = (
        f"install SFPI {want or '(see ttnn/tt_metal/sfpi-version)'} at {candidates[0]} or "
        f"{SYSTEM_SFPI} (NixOS: the flake's ttnn package links it in)"
    )
    for cand in candidates:
        if (cand / SFPI_GXX).exists():
            not_sfpi = _not_a_compiler(cand / SFPI_GXX)
            if not_sfpi:
                return Check("SFPI compiler", FAIL, f"{cand / SFPI_GXX}: {not_sfpi}", fix)
            have = _read(cand / "sfpi.version") or "unknown"
            if want is not None and have != want:
                return Check(
                    "SFPI compiler", FAIL, f"{cand}: version {have}, ttnn {facts['version']} "
                    f"was built for {want}", fix,
                )  # fmt: skip
            return Check("SFPI compiler", OK, f"{cand} (version {have}, the wheel's {want})")
    where = " or ".join(str(c / SFPI_GXX) for c in candidates)
    return Check("SFPI compiler", FAIL, f"not found at {where}", fix)


def kernel_cache_dir(host: Host) -> tuple[Path, bool]:
    """Where tt-metal writes its JIT output, and whether TT_METAL_CACHE chose it."""
    explicit = host.getenv("TT_METAL_CACHE")
    if explicit:
        return Path(explicit), True
    home = host.getenv("HOME")
    if home and Path(home).exists():
        return Path(home) / ".cache", False
    return Path(tempfile.gettempdir()), False


def check_kernel_cache(host: Host) -> Check:
    folder, explicit = kernel_cache_dir(host)
    fix = "make it writable, or set TT_METAL_CACHE to a writable folder (the NixOS unit does)"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".tt-serve-doctor-"):
            pass
    except OSError as exc:
        return Check("kernel cache", FAIL, f"{folder} not writable ({exc.strerror})", fix)
    if not explicit:
        return Check(
            "kernel cache", WARN, f"{folder} (TT_METAL_CACHE unset: tt-metal falls back to $HOME)",
            "set TT_METAL_CACHE so compiled kernels persist where you expect",
        )  # fmt: skip
    return Check("kernel cache", OK, f"{folder} (TT_METAL_CACHE), writable")


def check_python(python: str, facts: Mapping[str, Any] | None = None) -> Check:
    version = (facts or {}).get("python") or platform.python_version()
    return Check("python", OK, f"{version} ({python})")


def ttnn_checks(
    host: Host, device_ids: Sequence[int], python: str,
    probe: Callable[[str], Mapping[str, Any]] | None = None,
) -> list[Check]:  # fmt: skip
    facts = (probe or (lambda py: probe_ttnn(py, host.env)))(python)
    devices = check_devices(host, device_ids)
    return [
        check_python(python, facts),
        check_ttnn(facts),
        devices,
        check_driver(host),
        check_hugepages(host, len(device_nodes(host)) or len(device_ids)),
        check_memlock(),
        check_sfpi(host, facts),
        check_kernel_cache(host),
        check_mock_mode(host),
    ]


def check_mock_mode(host: Host) -> Check:
    """The test and plan environments' mock boxes must not leak onto a host: with
    TT_METAL_MOCK_CLUSTER_DESC_PATH set tt-metal opens a simulated box (nothing computes), and
    the trace shim (scripts/mock-trace-shim.c) rewrites two of tt-metal's internals."""
    from tt_serve.model.tt.plan.mock import MOCK_ENV, TRACE_SHIM

    found = []
    desc = host.getenv(MOCK_ENV)
    if desc:
        found.append(f"{MOCK_ENV}={desc}: tt-metal would open a simulated box, not the cards")
    preload = host.getenv("LD_PRELOAD") or ""
    if TRACE_SHIM in preload:
        found.append(
            f"LD_PRELOAD={preload}: the mock-box trace shim (scripts/mock-trace-shim.c), which "
            "rewrites tt-metal's Buffer::address and issue queue"
        )
    if found:
        return Check(
            "mock mode", FAIL, "; ".join(found),
            f"unset {MOCK_ENV} and LD_PRELOAD: the mock boxes are for tests and `tt-serve plan`",
        )  # fmt: skip
    return Check("mock mode", OK, "off (no mock box, no trace shim)")


def check_native() -> Check:
    """The CPU path's C kernels (model/kernels/native.c): compiled here, or why not (a warning:
    the torch ops run instead, slower)."""
    from tt_serve.model.kernels import native

    k = native.kernels()
    if k is None:
        return Check(
            "C kernels", WARN, f"{native.why_not()}; the torch ops run instead (slower)",
            "install a C compiler (cc or gcc, or set $CC); TT_SERVE_NATIVE=0 turns them off",
        )  # fmt: skip
    gemv = {255: "with the 8-bit (AVX512-VNNI)", 127: "with the 7-bit (AVX2)"}.get(
        k.screen_levels, "without (no AVX2) the"
    )
    return Check("C kernels", OK, f"compiled, {gemv} int8 screen GEMV")


def torch_checks(device: str) -> list[Check]:
    checks = [check_python(sys.executable)]
    try:
        import torch
    except ImportError as exc:
        checks.append(Check("torch", FAIL, f"import failed: {exc}", "install torch"))
        return checks
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    checks.append(Check("torch", OK, f"{torch.__version__}, {torch.get_num_threads()} threads"))
    checks.append(Check("cpu", OK, f"{os.cpu_count()} cores, {platform.machine()}"))
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(count))
    detail = f"{count} device(s): {names}" if count else "not available"
    if device == "cpu":
        checks.append(Check("cuda", OK, detail + " (not needed for --device cpu)"))
        checks.append(check_native())
        return checks
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        checks.append(Check(
            "cuda", FAIL, f"{device} requested; {detail}",
            "use --device cpu, or a host with that GPU and a CUDA build of torch",
        ))  # fmt: skip
    else:
        checks.append(Check("cuda", OK, detail))
    return checks


def render(checks: Sequence[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"[{c.status:>4}] {c.name}: {c.detail}")
        if c.fix and c.status != OK:
            lines.append(f"       -> {c.fix}")
    failed = [c.name for c in checks if c.status == FAIL]
    lines.append("serving would fail: " + ", ".join(failed) if failed else "ready to serve")
    return "\n".join(lines)


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected device ids 0, 1, ... (got {text!r})")
    return ids


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="tt-serve doctor", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("torch", "ttnn"), default="torch")
    p.add_argument("--device", default="cpu", help="torch backend: cpu, cuda or cuda:N")
    p.add_argument("--device-ids", type=_ids, default=[0], help="ttnn devices, e.g. 0 or 0,1")
    p.add_argument(
        "--python", default=sys.executable, help="interpreter to probe ttnn in (default: this one)"
    )
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    a = p.parse_args(argv)
    if a.backend == "torch" and not re.fullmatch(r"cpu|cuda(:[0-9]+)?", a.device):
        p.error(f"--device must be cpu, cuda or cuda:N (got {a.device!r})")
    try:
        checks = (
            ttnn_checks(Host(), a.device_ids, a.python)
            if a.backend == "ttnn"
            else torch_checks(a.device)
        )
    except Exception as exc:  # a doctor must report, never crash with a traceback
        checks = [Check("doctor", FAIL, f"internal error: {type(exc).__name__}: {exc}")]
    ok = not any(c.status == FAIL for c in checks)
    if a.json:
        doc = {"backend": a.backend, "ok": ok, "checks": [asdict(c) for c in checks]}
        text = json.dumps(doc, indent=2)
    else:
        text = render(checks)
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `| head`: the reader left; the exit status still tells
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0 if ok else 1
