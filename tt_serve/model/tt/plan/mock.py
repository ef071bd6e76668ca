"""tt-metal's own verdict on a plan: the backend's startup, pools and workload run by the real
ttnn 0.81.1 on a *mock* box of the planned board (no card; ``TT_METAL_MOCK_CLUSTER_DESC_PATH``
names a cluster descriptor written from our board table, ``plan/cluster_desc.py``).

Under mock tt-metal runs every op's own validation, lays out its circular buffers in L1 and
allocates every buffer in the real DRAM and L1 banks; only the math is missing (reads return
zeros), and kernels are built by a stand-in compiler that builds nothing (``scripts/mock-sfpi``,
installed in the ttnn venv only). So "this configuration starts on this box" is shown by
tt-metal's code, not by our model of it (``virtual/``).

What differs from a card, said in the verdict:

* traces: 0.81.1 crashes capturing a trace under mock (mock programs have no kernel-binary
  buffer, and the capture path asks its address; then replay faults on mock's misaligned issue
  queue). ``scripts/mock-trace-shim.c``, built into the ttnn venv by scripts/setup-ttnn-venv and
  preloaded into the child, mends both, so the decode step (and prefill when traced) is captured,
  replayed and released by tt-metal, which checks each trace against the real trace region. A
  mock trace has no kernel binaries, so it is smaller than a card's: the region is still sized
  on the virtual device. Without the shim (no C compiler) every program runs eagerly and the
  verdict says so;
* weights are allocated without data (``ttnn.allocate_tensor_on_device``): real sizes take no
  host memory.

The run happens in a child process (``python -m tt_serve.model.tt.plan.mock``): the variable is
read when tt-metal first opens the cluster, and several ttnn failures abort the process instead
of raising. ``check`` is the parent's side; the child prints one ``MOCK_RESULT`` JSON line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tt_serve.model.tt.boards import device_spec
from tt_serve.model.tt.options import TTOptions

MOCK_ENV = "TT_METAL_MOCK_CLUSTER_DESC_PATH"
TRACE_SHIM = "tt-serve-mock-trace.so"  # in the ttnn venv's lib/ (scripts/setup-ttnn-venv)
RESULT = "MOCK_RESULT "
TTNN_VERSION = "0.81.1"
_SOURCE_ROOT = Path(__file__).resolve().parents[4]  # the child imports tt_serve from here
# Where tt-metal throws: "... @ /project/ttnn/cpp/.../bank_manager.cpp:514: ..." or
# "TT_FATAL @ .../matmul_device_operation.cpp:79: ..."
_WHERE = re.compile(r"([A-Za-z0-9_]+\.(?:cpp|hpp|h|cc)):(\d+)")
_THROW = re.compile(r"(TT_FATAL|TT_THROW)[^\n]*")


@dataclass
class MockVerdict:
    """What tt-metal said: ``ok`` or the refusal (its message, the file:line it came from, the
    phase it stopped in), and the real allocator's figures per bank after each phase."""

    ok: bool
    checker: str
    board: str
    message: str = ""
    where: str = ""
    phase: str = ""
    ops: int = 0  # ttnn calls made, every op validated by tt-metal
    eager: bool = True  # every program ran eagerly (no trace shim)
    traces: int = 0  # traces tt-metal captured, replayed and released (with the shim)
    dram_banks: int = 0
    dram_bank_bytes: int = 0
    dram_after: dict[str, int] = field(default_factory=dict)  # phase -> bytes per bank
    dram_largest_free: int = 0  # per bank, after the workload
    l1_banks: int = 0
    l1_bank_bytes: int = 0
    l1_after: int = 0  # L1 allocated per bank after the workload
    l1_peak: int = 0  # peak L1 of a prefill chunk's and a decode step's programs (ttnn.graph)
    kv_blocks: int = 0  # the plan's KV pool
    kv_blocks_more: int = 0  # blocks tt-metal's allocator still took on top, after the workload
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def checker_name(board: str) -> str:
    return f"tt-metal {TTNN_VERSION} on a mock {board}"


def ttnn_python() -> str | None:
    """An interpreter that imports ttnn, for the child: ``TT_SERVE_TTNN_PYTHON``, this one, or
    the ttnn venv beside the source tree (``scripts/setup-ttnn-venv``: Python 3.12 with no
    torch, where the virtual device cannot run; so the planner runs here, the mock there)."""
    import importlib.util

    chosen = os.environ.get("TT_SERVE_TTNN_PYTHON")
    if chosen:
        return chosen
    if importlib.util.find_spec("ttnn") is not None:
        return sys.executable
    venv = Path(os.environ.get("TTNN_VENV", _SOURCE_ROOT / ".venv-ttnn")) / "bin" / "python"
    return str(venv) if venv.exists() else None


def trace_shim(python: str) -> Path | None:
    """The trace shim scripts/setup-ttnn-venv built into ``python``'s venv, if it is there."""
    shim = Path(python).absolute().parent.parent / "lib" / TRACE_SHIM
    return shim if shim.is_file() else None


def kernel_cache_dir() -> Path:
    """tt-metal's JIT cache for mock runs: kept apart from a host's real kernel cache (the
    stand-in's "binaries" must never be loaded on a card)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tt-serve" / "mock-kernels"


def check(
    config: dict[str, Any],
    device: str,
    options: TTOptions,
    kv_blocks: int,
    *,
    python: str | None = None,
    timeout: float = 600.0,
    extra_env: dict[str, str] | None = None,
    traces: bool = True,
) -> MockVerdict:
    """Run the plan's start (``options``, the same the virtual plan and a real start take) with
    ``kv_blocks`` KV blocks for the model ``config`` (its config.json) on a mock box of
    ``device``, in a child
    ``python`` (default: :func:`ttnn_python`); traced as on a card where the venv has the trace
    shim and ``traces`` is left on, else every program eager."""
    from tt_serve.model.tt.plan.cluster_desc import write_cluster_descriptor

    board = device_spec(device)
    python = python or ttnn_python() or sys.executable
    shim = trace_shim(python) if traces else None
    with tempfile.TemporaryDirectory(prefix="tt-serve-mock-") as tmp:
        desc = write_cluster_descriptor(board, Path(tmp))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TT_METAL")}
        env.update(
            {
                MOCK_ENV: str(desc),
                "TT_METAL_CACHE": str(kernel_cache_dir()),
                "TT_LOGGER_LEVEL": env.get("TT_LOGGER_LEVEL", "error"),
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(_SOURCE_ROOT), env.get("PYTHONPATH")) if p
                ),
            }
        )
        if shim is not None:
            preload = os.pathsep.join(p for p in (str(shim), env.get("LD_PRELOAD")) if p)
            env["LD_PRELOAD"] = preload
        env.update(extra_env or {})
        job = {
            "config": config,
            "device": device,
            "options": options.to_json(),
            "kv_blocks": kv_blocks,
            "traced": shim is not None,  # the child runs traced only with the shim preloaded
        }
        try:
            proc = subprocess.run(
                [python, "-m", "tt_serve.model.tt.plan.mock"],
                input=json.dumps(job),
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=tmp,  # mock mode writes ./generated/
                env=env,
            )
        except subprocess.TimeoutExpired:
            return MockVerdict(
                False, checker_name(board.name), board.name, f"no answer in {timeout:.0f} s"
            )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return MockVerdict(**json.loads(line[len(RESULT) :]))
    # The child died (tt-metal aborts on some failures): its last TT_FATAL / TT_THROW line.
    text = proc.stderr + proc.stdout
    throws = [m.group(0) for m in _THROW.finditer(text)]
    message = throws[-1] if throws else (text.strip().splitlines() or ["no output"])[-1]
    where = _WHERE.search(message)
    return MockVerdict(
        False,
        checker_name(board.name),
        board.name,
        f"the mock run died (exit {proc.returncode}): {message[:2000]}",
        where=f"{where.group(1)}:{where.group(2)}" if where else "",
    )


def _child(job: dict[str, Any]) -> MockVerdict:
    import ttnn

    from tt_serve.model.spec import ModelSpec
    from tt_serve.model.tt.plan.oplog import OpLog
    from tt_serve.model.tt.plan.startup import PlanError, run_on_ttnn

    options = TTOptions.from_json(job["options"])
    board = device_spec(job["device"])
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(job["config"]))
        spec = ModelSpec.from_hf_dir(tmp)
    log = OpLog(None)
    traced = bool(job.get("traced"))
    verdict = MockVerdict(True, checker_name(board.name), board.name, eager=not traced)
    start = time.perf_counter()
    run = None
    try:
        run = run_on_ttnn(ttnn, spec, board, options, int(job["kv_blocks"]), log, traced=traced)
    except PlanError as exc:
        where = _WHERE.search(exc.message)
        verdict.ok, verdict.message, verdict.phase = False, _first_lines(exc.message), log.phase
        verdict.where = f"{where.group(1)}:{where.group(2)}" if where else ""
    verdict.seconds = round(time.perf_counter() - start, 2)
    verdict.ops = log.count
    if run is not None and run.ops is not None:
        dram, l1 = run.ops.memory_view("DRAM"), run.ops.memory_view("L1")
        verdict.dram_banks, verdict.dram_bank_bytes = dram.banks, dram.bank_bytes
        verdict.dram_after = dict(run.after)
        verdict.dram_largest_free = dram.largest_free_block_per_bank
        verdict.l1_banks, verdict.l1_bank_bytes = l1.banks, l1.bank_bytes
        verdict.l1_after = l1.allocated_per_bank
        verdict.l1_peak = run.peak_l1
        verdict.kv_blocks, verdict.kv_blocks_more = int(job["kv_blocks"]), run.kv_more
        verdict.traces = run.traces
        if run.backend is not None:
            run.backend.close()  # releases the traces, then closes the device
        else:
            run.ops.close_device()
    return verdict


def _first_lines(message: str, limit: int = 6) -> str:
    """tt-metal's message without its backtrace."""
    lines = [ln for ln in message.splitlines() if ln.strip() and not ln.startswith(" --- ")]
    cut = next((i for i, ln in enumerate(lines) if ln.startswith("backtrace")), len(lines))
    return "\n".join(lines[: min(cut, limit)])


def main() -> None:
    if MOCK_ENV not in os.environ:
        sys.exit(f"{MOCK_ENV} is not set: this runs only as plan/mock.check's child")
    verdict = _child(json.loads(sys.stdin.read()))
    print(RESULT + json.dumps(verdict.to_json()), flush=True)


if __name__ == "__main__":
    main()
