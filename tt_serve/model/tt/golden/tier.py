"""``GoldenTier``: puts ttnn's golden functions beside (``compare``) or in place of (``golden``)
the virtual device's own math, op by op, and keeps the per-op table.

The hook has two parts. A wrapper over each public op attribute of every chip
(``calls.ENTRY_POINTS``; the mesh's CCLs) records the call's arguments, tensors kept as their
buffers (a trace replay rereads them), while the op runs. ``DeviceBase._op`` then hands the
op's compute to ``compute_hook``, which returns a checked compute: it runs the virtual math and
the golden on the buffers' current values, records the difference and returns the golden's
result (``golden`` mode) or the virtual one (``compare``). ``_op`` runs the checked compute now
and records it for replay, so replays of a captured trace are checked and computed the same way.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tt_serve.model.tt.golden.calls import ENTRY_POINTS, GOLDENS, NO_GOLDEN, mesh_golden
from tt_serve.model.tt.virtual.tensors import Ref, Tensor

MODES = ("compare", "golden")
CCLS = ("all_gather_async", "reduce_scatter_minimal_async")


@dataclass
class OpStats:
    """One op's row: runs (eager, captured and replayed), how many of them the golden checked
    (all, for an op with a golden: a run it missed is a call the tier did not see), which
    golden, the largest differences seen. ``max_rel`` is normwise: max |virtual - golden| /
    max |golden| over one output."""

    op: str
    golden: str | None
    calls: int = 0
    checked: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatches: int = 0  # integer outputs (ids) that differ, ties excepted

    def row(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "calls": self.calls,
            "checked": self.checked,
            "golden": self.golden,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "mismatches": self.mismatches,
        }


class GoldenMismatch(AssertionError):
    """A golden's result has another shape than the virtual op's (a layout disagreement)."""


class GoldenTier:
    """Install on an (opened) ``VirtualTTNN`` or ``VirtualMeshTTNN`` before building on it."""

    def __init__(self, mode: str = "compare") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        import ttnn  # only the ttnn venv has it

        self.ttnn, self.mode = ttnn, mode
        self.stats: dict[str, OpStats] = {}

    def install(self, fake: Any) -> None:
        """Hook every chip of ``fake`` (a mesh makes its chips when it opens: install after)."""
        chips = getattr(fake, "chips", None) or [fake]
        for chip in chips:
            chip.compute_hook = self._hook(chip)
            chip._golden_call = None
            for op, path in ENTRY_POINTS.items():
                owner, attr = _owner(chip, path)
                setattr(owner, attr, _recording(chip, op, getattr(owner, attr)))
        if hasattr(fake, "chips"):
            own = fake.experimental._own
            for op in CCLS:
                own[op] = _recording_ccl(fake, op, own[op])

    def table(self) -> list[dict[str, Any]]:
        return [s.row() for s in sorted(self.stats.values(), key=lambda s: s.op)]

    def _row(self, name: str) -> OpStats:
        if name not in self.stats:
            if name in GOLDENS:
                golden = GOLDENS[name][0]
            elif name in CCLS:
                golden = "all_gather" if name == CCLS[0] else "reduce_scatter"
            else:
                golden = None
            self.stats[name] = OpStats(name, golden)
        return self.stats[name]

    def _hook(self, chip: Any) -> Callable[[str, Callable[[], Any]], Callable[[], Any]]:
        def hook(name: str, compute: Callable[[], Any]) -> Callable[[], Any]:
            row = self._row(name)
            call = chip._golden_call
            if row.golden is None or call is None or call[0] != name or name in NO_GOLDEN:

                def counted() -> Any:
                    row.calls += 1
                    return compute()

                return counted
            golden = self._golden(name, call[1])

            def checked() -> Any:
                row.calls += 1
                row.checked += 1
                mine = compute()
                theirs = _like(mine, golden())
                self._compare(row, mine, theirs)
                return theirs if self.mode == "golden" else mine

            return checked

        return hook

    def _golden(self, name: str, frozen: dict[str, Any]) -> Callable[[], Any]:
        t = self.ttnn
        if name in CCLS:
            return lambda: mesh_golden(
                t,
                name,
                [_thaw(r) for r in frozen["shards"]],
                frozen["dim"],
                frozen["line"],
                frozen["chip"],
            )
        path, adapter = GOLDENS[name]
        fn = t.get_golden_function(_resolve(t, path))
        return lambda: adapter(t, fn, {k: _thaw(v) for k, v in frozen.items()})

    def _compare(self, row: OpStats, mine: Any, theirs: Any) -> None:
        outs = list(zip(_flat(mine), _flat(theirs), strict=True))
        for a, b in outs:
            if a.shape != b.shape:
                raise GoldenMismatch(
                    f"{row.op}: virtual {tuple(a.shape)} vs golden {tuple(b.shape)}"
                )
            if not a.is_floating_point():
                differ = a != b
                if row.op == "topk":
                    # An unstable top-k may return any index among equal values (the 0.81.1
                    # topk golden masks tied positions out of its own comparison): an index
                    # counts as wrong only where the values picked differ too.
                    differ &= outs[0][0] != outs[0][1]
                row.mismatches += int(differ.sum())
                continue
            diff = torch.where(a == b, torch.zeros(()), (a - b).abs())
            worst = float(diff.nan_to_num(nan=math.inf).max()) if diff.numel() else 0.0
            scale = float(b[b.isfinite()].abs().max()) if b.isfinite().any() else 0.0
            row.max_abs = max(row.max_abs, worst)
            row.max_rel = max(row.max_rel, worst / scale if scale > 0 else worst)


def _owner(chip: Any, path: str) -> tuple[Any, str]:
    *parts, attr = path.split(".")
    owner = chip
    for p in parts:
        owner = getattr(owner, p)
    return owner, attr


def _resolve(ttnn: Any, path: str) -> Any:
    owner, attr = _owner(ttnn, path)
    return getattr(owner, attr)


def _freeze(v: Any) -> Any:
    """A call's argument as the checked compute keeps it: tensors as their buffers."""
    if isinstance(v, Tensor):
        return Ref(v)
    if isinstance(v, (list, tuple)) and any(isinstance(x, Tensor) for x in v):
        return [Ref(x) if isinstance(x, Tensor) else x for x in v]
    return v


def _thaw(v: Any) -> Any:
    if isinstance(v, Ref):
        return v.buffer.data
    if isinstance(v, list) and any(isinstance(x, Ref) for x in v):
        return [_thaw(x) for x in v]
    return v


def _recording(chip: Any, op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(fn)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        prev = chip._golden_call
        chip._golden_call = (op, {k: _freeze(v) for k, v in bound.arguments.items()})
        try:
            return fn(*args, **kwargs)
        finally:
            chip._golden_call = prev

    return wrapper


def _recording_ccl(mesh: Any, op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    sig = inspect.signature(fn)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        p = bound.arguments
        x, axis = p["input_tensor"], p["cluster_axis"]
        shards = [Ref(s) for s in x.shards]
        lines = mesh._lines(op, axis)
        for i, chip in enumerate(mesh.chips):
            line = next(ln for ln in lines if i in ln)
            frozen = {"shards": shards, "dim": p["dim"], "line": line, "chip": i}
            chip._golden_call = (op, frozen)
        try:
            return fn(*args, **kwargs)
        finally:
            for chip in mesh.chips:
                chip._golden_call = None

    return wrapper


def _flat(result: Any) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _like(mine: Any, theirs: Any) -> Any:
    """The golden's outputs in the virtual outputs' dtypes (values fp32 or int64)."""
    outs = [
        b.detach().to(a.dtype) if isinstance(b, torch.Tensor) else b
        for a, b in zip(_flat(mine), _flat(theirs), strict=True)
    ]
    return tuple(outs) if isinstance(mine, tuple) else outs[0]
