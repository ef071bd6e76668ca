"""The collectives of tensor-parallel serving on a Tenstorrent mesh: latency and bandwidth.

Measures what ``tt_serve/model/tt/runtime/ccl.py`` runs (its ``TensorParallelCCL``, so the same
double-buffered global semaphores, barrier semaphore, ``num_links`` and ``Topology.Linear`` on
the ``FABRIC_1D`` fabric ``Ops.open_mesh`` brings up):

* ``all_gather``: ``ttnn.experimental.all_gather_async`` of a [1, 1, rows, H / N] shard per chip
  into [1, 1, rows, H] on every chip (the gather after each reduction);
* ``reduce_scatter``: ``ttnn.experimental.reduce_scatter_minimal_async`` of a [1, 1, rows, H]
  partial sum per chip, chunk i of the sum left on chip i;
* ``all_reduce``: the two in sequence, as a row-parallel projection's reduction runs.

Message sizes: ``--rows`` 32 (a batch-32 decode step) and 256 (a prefill chunk) times the hidden
size H of each ``--models`` entry (read from ``tt_serve/model/published.py``), bf16 TILE. Each
is timed eagerly (``--iters`` back-to-back calls, then one ``synchronize_device``) and under
trace replay (``--trace-ops`` calls captured in one trace, replayed ``--iters`` times
non-blocking, then one synchronize), ``--rounds`` times; the median round is reported.

Bandwidth follows nccl-tests' conventions (nccl-tests: doc/PERFORMANCE.md), in 1e9 B/s, with
``t`` the time of one collective and N the chips:

* all_gather: size S = the gathered output's bytes (rows x H x 2); algbw = S / t,
  busbw = algbw x (N - 1) / N;
* reduce_scatter: S = one chip's input bytes (rows x H x 2); algbw = S / t,
  busbw = algbw x (N - 1) / N;
* all_reduce: S = rows x H x 2; algbw = S / t, busbw = algbw x 2 (N - 1) / N.

Every result is also checked against numpy (the gather is the concatenation in mesh order, the
scatter the sum's chunk i on chip i, read from every chip); a mismatch makes the run exit 1.
One ledger line per run to ``bench/runs/ccl.jsonl`` (commit, source hash, machine, flags, the
device). Without a device it exits 2 with one line naming the problem. ``--fake`` runs every
case on tt_serve's contract fake of a mesh (``VirtualMeshTTNN``, numeric): a dry run of the
numerics and the device rules; its timings are CPU timings of the fake and it writes no ledger.

    python -m bench.kernels.tt_ccl                         # every chip ttnn sees, 9B and 27B widths
    python -m bench.kernels.tt_ccl --chips 2 --rows 32 --iters 20
    python -m bench.kernels.tt_ccl --fake --chips 8        # dry run, no device
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.provenance import REPO_ROOT, append_ledger
from tt_serve.model.tt.launch import DEFAULT_L1_SMALL
from tt_serve.model.tt.ops import Ops, Tensor
from tt_serve.model.tt.options import DEFAULT_CCL_LINKS
from tt_serve.model.tt.probe import NoDeviceError, probe_devices
from tt_serve.model.tt.runtime.ccl import TensorParallelCCL

LEDGER = REPO_ROOT / "bench" / "runs" / "ccl.jsonl"
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
MODES = ("eager", "trace")
BF16_BYTES = 2
# bf16 holds every integer of magnitude <= 2^8 exactly (8 significant bits). Inputs are integers
# in [-INT_RANGE // N, INT_RANGE // N], so every partial sum a reduction forms, in any order and
# at any accumulation precision, is exact: the device result must equal numpy's bit for bit.
INT_RANGE = 1 << 8
FAKE_NOTE = "fake: timings are not device timings"


def bus_factor(collective: str, n: int) -> float:
    """busbw / algbw (nccl-tests doc/PERFORMANCE.md)."""
    return (2.0 if collective == "all_reduce" else 1.0) * (n - 1) / n


@dataclass(frozen=True)
class Case:
    """One collective on one message: ``rows`` x ``hidden`` bf16 per chip (the reduction's
    input; the gather's output)."""

    collective: str
    rows: int
    hidden: int

    @property
    def size_bytes(self) -> int:
        """nccl-tests' S for this collective (see the module docstring)."""
        return self.rows * self.hidden * BF16_BYTES


class Bench:
    """The cases' inputs, references, calls and checks on an opened mesh of ``n`` chips."""

    def __init__(self, ops: Ops, n: int, links: int, seed: int = 0) -> None:
        self.ops, self.n = ops, n
        self.ccl = TensorParallelCCL(ops, (1, n), num_links=links)
        self.rng = np.random.default_rng(seed)

    def _ints(self, shape: tuple[int, ...]) -> np.ndarray:
        r = INT_RANGE // self.n
        return self.rng.integers(-r, r + 1, size=shape).astype(np.float32)

    def prepare(self, case: Case) -> tuple[Tensor, np.ndarray, Callable[[Tensor], Tensor]]:
        """(device input, the full [1, 1, rows, H] result every chip must end up with or
        share, the call)."""
        ops, ccl, shape = self.ops, self.ccl, (1, 1, case.rows, case.hidden)
        if case.collective == "all_gather":
            full = self._ints(shape)
            x = ops.upload(full, "bfloat16", shard_dim=3)  # chip c: columns [c H/N, (c+1) H/N)
            return x, full, lambda t: ccl.all_gather(t, -1, 1)
        parts = self._ints((self.n, *shape[1:]))  # chip c's partial sums: parts[c]
        x = ops.upload(parts, "bfloat16", shard_dim=0)
        want = parts.sum(axis=0, keepdims=True)
        if case.collective == "reduce_scatter":
            return x, want, lambda t: ccl.reduce_scatter(t, -1, 1)
        return x, want, ccl.all_reduce

    def mismatch(self, case: Case, out: Tensor, want: np.ndarray) -> float:
        """Largest |device - numpy| over every chip's copy (0.0: exact)."""
        ops = self.ops
        if case.collective == "reduce_scatter":
            got = ops.read_concat(out, -1)  # chunk i from chip i, in mesh order
            return float(np.abs(got - want).max())
        copies = ops.read_concat(out, 0)  # N replicas stacked, one per chip
        assert copies.shape[0] == self.n, copies.shape
        return float(np.abs(copies - want).max())


def _eager(ops: Ops, call: Callable[[Tensor], Tensor], x: Tensor, iters: int) -> float:
    """Seconds per call over ``iters`` back-to-back calls (outputs freed as they are made:
    the device runs in order, so a freed buffer is rewritten only by a later command)."""
    ops.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        ops.deallocate(call(x))
    ops.synchronize()
    return (time.perf_counter() - start) / iters


def _traced(
    b: Bench, call: Callable[[Tensor], Tensor], x: Tensor, per_trace: int, iters: int, rounds: int
) -> tuple[list[float], list[Tensor], Any]:
    """Seconds per call of ``rounds`` rounds of ``iters`` replays of a trace holding
    ``per_trace`` calls; the calls' outputs and the trace (the caller releases the trace, then
    frees the outputs: replays write them). The semaphore cycle restarts before capture, as
    every program of the backend does, so each replay uses the handles in the captured order;
    the program cache is warm (eager runs)."""
    ops = b.ops
    b.ccl.restart()
    tid = ops.begin_trace()
    outs = [call(x) for _ in range(per_trace)]
    ops.end_trace(tid)
    ops.execute_trace(tid, blocking=False)  # the first replay is not timed
    times = []
    for _ in range(rounds):
        ops.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            ops.execute_trace(tid, blocking=False)
        ops.synchronize()
        times.append((time.perf_counter() - start) / (iters * per_trace))
    return times, outs, tid


def measure(
    b: Bench,
    case: Case,
    *,
    modes: Sequence[str] = MODES,
    warmup: int = 3,
    iters: int = 20,
    rounds: int = 3,
    per_trace: int = 10,
) -> dict[str, Any]:
    """Latency (us), algbw and busbw (GB/s) per mode and the numeric check of ``case``."""
    ops, n = b.ops, b.n
    if case.hidden % (n * 32):
        raise ValueError(f"hidden {case.hidden} does not split into {n} whole tiles of 32")
    x, want, call = b.prepare(case)
    out = call(x)  # the compile run
    errors = {"eager": b.mismatch(case, out, want)}
    ops.deallocate(out)
    for _ in range(warmup):
        ops.deallocate(call(x))
    result: dict[str, Any] = {
        "collective": case.collective,
        "shape_per_chip": _shape(case, n),
        "size_bytes": case.size_bytes,
    }
    for mode in modes:
        if mode == "eager":
            times = [_eager(ops, call, x, iters) for _ in range(rounds)]
        else:
            times, outs, tid = _traced(b, call, x, per_trace, iters, rounds)
            errors["trace"] = b.mismatch(case, outs[-1], want)
            ops.release_trace(tid)
            for o in outs:
                ops.deallocate(o)
        t = statistics.median(times)
        algbw = case.size_bytes / t / 1e9
        result[mode] = {
            "latency_us": t * 1e6,
            "latency_us_rounds": [s * 1e6 for s in times],
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * bus_factor(case.collective, n),
        }
    ops.deallocate(x)
    result["max_abs_error"] = errors
    result["exact"] = all(e == 0.0 for e in errors.values())
    return result


def _shape(case: Case, n: int) -> list[int]:
    width = case.hidden // n if case.collective == "all_gather" else case.hidden
    return [1, 1, case.rows, width]


def hidden_sizes(models: Sequence[str]) -> dict[str, int]:
    from tt_serve.model.published import published_config

    return {m: int(published_config(m)["text_config"]["hidden_size"]) for m in models}


def _line(r: dict[str, Any], modes: Sequence[str]) -> str:
    timing = "  ".join(
        f"{m} {r[m]['latency_us']:9.1f} us algbw {r[m]['algbw_gbps']:7.3f} "
        f"busbw {r[m]['busbw_gbps']:7.3f} GB/s"
        for m in modes
    )
    check = "exact" if r["exact"] else f"MISMATCH {r['max_abs_error']}"
    return f"{r['collective']:>14} {r['shape_per_chip']!s:>18}  {timing}  {check}"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench.kernels.tt_ccl", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--chips", type=int, default=0, help="0: every chip ttnn sees (--fake: 2)")
    ap.add_argument("--models", default="qwen3.5-9b,qwen3.6-27b", help="hidden sizes from these")
    ap.add_argument("--hidden", default="", help="explicit hidden sizes H,H,... (over --models)")
    ap.add_argument("--rows", default="32,256", help="rows per message: decode batch, chunk")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trace-ops", type=int, default=10, help="calls captured in one trace")
    ap.add_argument("--links", type=int, default=DEFAULT_CCL_LINKS, help="num_links per CCL")
    ap.add_argument("--trace-region-size", type=int, default=64 << 20, help="bytes per chip")
    ap.add_argument("--fake", action="store_true", help="dry run on the fake mesh, no ledger")
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    return ap


def _open(a: argparse.Namespace) -> tuple[Ops, int] | str:
    """The opened mesh and its chip count, or the one-line reason there is none."""
    if a.fake:
        from tt_serve.model.tt.virtual.mesh import VirtualMeshTTNN

        n = a.chips or 2
        ops = Ops(VirtualMeshTTNN(num_devices=n, max_links=a.links))
    else:
        try:
            seen = probe_devices()
        except NoDeviceError as exc:
            return f"{exc} (--fake runs a dry run on tt_serve's fake mesh)"
        n = a.chips or seen
        if n < 2 or n > seen:
            return (
                f"a 1 x {n} mesh needs {max(n, 2)} Tenstorrent chips; ttnn sees {seen} "
                "(--chips N picks fewer; --fake runs a dry run on tt_serve's fake mesh)"
            )
        ops = Ops.load()
    ops.open_mesh((1, n), trace_region_size=a.trace_region_size, l1_small_size=DEFAULT_L1_SMALL)
    return ops, n


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    opened = _open(a)
    if isinstance(opened, str):
        print(f"bench.kernels.tt_ccl: {opened}", file=sys.stderr)
        return 2
    ops, n = opened
    widths = (
        {f"H={h}": int(h) for h in a.hidden.split(",")}
        if a.hidden
        else hidden_sizes(a.models.split(","))
    )
    modes = a.modes.split(",")
    rows = [int(r) for r in a.rows.split(",")]
    results = []
    if a.fake:
        print(FAKE_NOTE)
    print(f"1 x {n} mesh, num_links {a.links}, Topology.Linear, bf16 TILE")
    try:
        b = Bench(ops, n, a.links)
        for name, hidden in widths.items():
            for r in rows:
                for coll in a.collectives.split(","):
                    res = measure(
                        b,
                        Case(coll, r, hidden),
                        modes=modes,
                        warmup=a.warmup,
                        iters=a.iters,
                        rounds=a.rounds,
                        per_trace=a.trace_ops,
                    )
                    res["model"] = name
                    results.append(res)
                    print(_line(res, modes))
        device = {"chips": n, "arch": None if a.fake else ops.arch_name()}
    finally:
        ops.close_device()
    exact = all(r["exact"] for r in results)
    if not exact:
        print("bench.kernels.tt_ccl: a collective's result differs from numpy", file=sys.stderr)
    if a.fake:
        print(FAKE_NOTE)
        return 0 if exact else 1
    params = {
        "chips": n,
        "mesh": [1, n],
        "links": a.links,
        "topology": "Linear",
        "fabric": "FABRIC_1D",
        "rows": rows,
        "hidden": widths,
        "modes": modes,
        "warmup": a.warmup,
        "iters": a.iters,
        "rounds": a.rounds,
        "trace_ops": a.trace_ops,
        "bandwidth": "nccl-tests doc/PERFORMANCE.md: algbw = S / t (1e9 B/s); busbw = algbw x "
        "(N-1)/N for all_gather (S = output bytes) and reduce_scatter (S = input bytes), "
        "x 2(N-1)/N for all_reduce",
    }
    append_ledger(
        a.ledger,
        "tt_ccl",
        flags=sys.argv[1:] if argv is None else list(argv),
        device=device,
        params=params,
        results=results,
        exact=exact,
    )
    print(f"ledger: {a.ledger}")
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
