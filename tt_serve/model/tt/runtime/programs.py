"""Programs: one captured trace per (phase, bucket), captured after a compile run (as
``cuda/programs``).

tt-metal's rules, kept here: run the exact program once before capturing (every kernel must be
in the program cache), capture only device ops (the program never touches the host), replay
with the persistent buffers refreshed in place, and capture everything up front, after the pools
exist, so nothing is allocated behind a live trace. A program added with ``traced=False`` runs
eagerly: the debugging path, the reference the traced path is compared with, and untraced
prefill (tt-metal traces decode always, prefill only when asked).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from tt_serve.model.tt.ops import Ops


class Programs:
    def __init__(self, ops: Ops, *, on_capture: Callable[[], None] | None = None) -> None:
        """``on_capture``: called once before the first capture (a hook for observers such as
        the planner's op log; it must not touch the device)."""
        self.ops, self.on_capture = ops, on_capture
        self._programs: dict[Hashable, Callable[[], None]] = {}
        self._traced: set[Hashable] = set()
        self._traces: dict[Hashable, Any] = {}

    def add(self, key: Hashable, program: Callable[[], None], *, traced: bool) -> None:
        if key in self._programs:
            raise ValueError(f"program {key!r} registered twice")
        self._programs[key] = program
        if traced:
            self._traced.add(key)

    def traced(self, key: Hashable) -> bool:
        """Whether ``key`` replays a captured trace (else it runs eagerly)."""
        return key in self._traced

    def capture_all(self) -> None:
        """Compile-run then capture every program registered as traced."""
        if self.on_capture is not None:
            self.on_capture()
        for key, program in self._programs.items():
            if key in self._traces or key not in self._traced:
                continue
            program()  # fills the program cache; inputs are idle, so no state changes
            trace_id = self.ops.begin_trace()
            program()
            self.ops.end_trace(trace_id)
            self._traces[key] = trace_id

    @property
    def keys(self) -> tuple[Hashable, ...]:
        """The registered programs' keys, in registration order."""
        return tuple(self._programs)

    @property
    def num_traces(self) -> int:
        return len(self._traces)

    def run(self, key: Hashable, *, blocking: bool = False) -> None:
        if key in self._traced:
            self.ops.execute_trace(self._traces[key], blocking=blocking)
        else:
            self._programs[key]()

    def release(self) -> None:
        for trace_id in self._traces.values():
            self.ops.release_trace(trace_id)
        self._traces.clear()
