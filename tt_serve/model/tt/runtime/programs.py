"""TracePrograms: the bucketed programs (``model/programs.py``: the registry and its rules)
replayed as ttnn traces (as ``torch/cuda/programs``).

tt-metal's own rules on top: the uncaptured run before a capture is the compile run (every kernel
must be in the program cache), a trace captures only device ops (the program never touches the
host), and a replay reads the persistent buffers refreshed in place. A program returns nothing:
its outputs are persistent buffers too. tt-metal traces decode always, prefill only when asked
(``traced=False`` runs it eagerly).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from tt_serve.model.programs import Programs
from tt_serve.model.tt.ops import Ops


class TracePrograms(Programs[None, Any]):
    def __init__(self, ops: Ops, *, on_capture: Callable[[], None] | None = None) -> None:
        super().__init__(on_capture=on_capture)
        self.ops = ops

    def _capture(self, todo: dict[Hashable, Callable[[], None]]) -> dict[Hashable, Any]:
        traces = {}
        for key, program in todo.items():
            program()  # fills the program cache; inputs are idle, so no state changes
            trace_id = self.ops.begin_trace()
            program()
            self.ops.end_trace(trace_id)
            traces[key] = trace_id
        return traces

    def _replay(self, handle: Any) -> None:
        self.ops.execute_trace(handle, blocking=False)

    def _release(self, handle: Any) -> None:
        self.ops.release_trace(handle)
