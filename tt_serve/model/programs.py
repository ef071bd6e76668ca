"""Programs: the fixed-shape programs of a traced backend, keyed by (phase, bucket), captured up
front and replayed. No torch, no ttnn: how a program is captured and replayed is the backend's
(``torch/cuda/programs.py``: CUDA graphs; ``tt/runtime/programs.py``: ttnn traces).

A program is a closure over persistent input buffers and the pools, registered once under its
key. The rules, kept here for both backends: capture everything up front, after every pool and
buffer exists (a capture keeps the addresses it saw, and nothing may be allocated behind a live
one), in registration order (register the largest buckets first), each program after an
uncaptured run with idle inputs (the padding block and idle or scratch slots only) so capturing
changes no sequence's state; a captured program only replays, others (``traced=False``: the
debugging path, the reference a captured one must equal, untraced prefill) run eagerly, through
the same buffers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Out = TypeVar("Out")  # what a run returns (CUDA graphs: their static outputs; ttnn: None)
Handle = TypeVar("Handle")  # a captured program (a graph and its outputs; a trace id)


class Programs(ABC, Generic[Out, Handle]):
    """The registry; a backend supplies ``_capture``, ``_replay`` and ``_release`` (and
    ``_eager`` when a plain call is not enough)."""

    def __init__(self, *, on_capture: Callable[[], None] | None = None) -> None:
        """``on_capture``: called as ``capture_all`` starts, before any capture (a hook for
        observers such as the ttnn planner's op log; it must not touch the device)."""
        self.on_capture = on_capture
        self._programs: dict[Hashable, Callable[[], Out]] = {}
        self._traced: set[Hashable] = set()
        self._captured: dict[Hashable, Handle] = {}
        self.runs: Counter[Hashable] = Counter()  # replays (or eager runs) per key

    def add(self, key: Hashable, program: Callable[[], Out], *, traced: bool) -> None:
        if key in self._programs:
            raise ValueError(f"program {key!r} registered twice")
        self._programs[key] = program
        if traced:
            self._traced.add(key)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._programs

    @property
    def keys(self) -> tuple[Hashable, ...]:
        """The registered programs' keys, in registration order."""
        return tuple(self._programs)

    def traced(self, key: Hashable) -> bool:
        """Whether ``key`` replays a captured program (else it runs eagerly)."""
        return key in self._traced

    @property
    def num_captured(self) -> int:
        return len(self._captured)

    def capture_all(self) -> None:
        """Capture every program registered as traced and not captured yet, in registration
        order."""
        if self.on_capture is not None:
            self.on_capture()
        todo = {
            k: p for k, p in self._programs.items() if k in self._traced and k not in self._captured
        }
        if todo:
            self._captured.update(self._capture(todo))

    def run(self, key: Hashable) -> Out:
        self.runs[key] += 1
        if key in self._traced:
            return self._replay(self._captured[key])
        return self._eager(self._programs[key])

    def release(self) -> None:
        for handle in self._captured.values():
            self._release(handle)
        self._captured.clear()

    # ---- the backend's part ----------------------------------------------------------------
    @abstractmethod
    def _capture(self, todo: dict[Hashable, Callable[[], Out]]) -> dict[Hashable, Handle]:
        """Run each program uncaptured (warm-up / compile run), then capture it."""

    @abstractmethod
    def _replay(self, handle: Handle) -> Out: ...

    def _eager(self, program: Callable[[], Out]) -> Out:
        return program()

    @abstractmethod
    def _release(self, handle: Handle) -> None: ...
