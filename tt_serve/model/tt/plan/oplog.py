"""The planner's op log: every ttnn call a plan makes, one JSON object per call, tagged with the
phase it ran in (startup, capture, prefill, decode, copy); ``tt-serve plan --ops FILE``."""

from __future__ import annotations

import json
from dataclasses import asdict
from types import SimpleNamespace
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # the virtual device holds torch tensors: imported only when a log is written
    from tt_serve.model.tt.virtual.tensors import Tensor


def _tensor_json(t: Tensor) -> dict[str, Any]:
    buf = t.buffer
    memory = "host" if not buf.on_device else ("l1_sharded" if buf.sharded else "dram")
    return {
        "shape": list(t.shape),
        "dtype": t.dtype.value,
        "layout": t.layout.value,
        "memory": memory,
    }


def _value_json(v: Any) -> Any:
    from tt_serve.model.tt.virtual.tensors import Tensor

    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)) and all(not isinstance(x, Tensor) for x in v):
        return [_value_json(x) for x in v]
    if hasattr(v, "value") and isinstance(v.value, (str, int)):
        return v.value
    if isinstance(v, SimpleNamespace):
        return {k: _value_json(x) for k, x in vars(v).items()}
    if hasattr(v, "__dataclass_fields__"):
        return {k: _value_json(x) for k, x in asdict(v).items()}
    return type(v).__name__


class OpLog:
    """Every ttnn call, one JSON object per call, tagged with the current phase."""

    def __init__(self, out: IO[str] | None) -> None:
        self.out, self.phase, self.count = out, "startup", 0

    def record(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.count += 1
        if self.out is None:
            return
        from tt_serve.model.tt.virtual.tensors import Tensor  # torch: only when writing

        tensors: dict[str, Any] = {}
        rest: dict[str, Any] = {}
        items = [(str(i), a) for i, a in enumerate(args)] + list(kwargs.items())
        for key, a in items:
            if isinstance(a, Tensor):
                tensors[key] = _tensor_json(a)
            elif isinstance(a, (list, tuple)) and any(isinstance(x, Tensor) for x in a):
                for j, x in enumerate(a):
                    if isinstance(x, Tensor):
                        tensors[f"{key}[{j}]"] = _tensor_json(x)
            elif key in kwargs:
                rest[key] = _value_json(a)
        line = {"op": name, "tensors": tensors, "kwargs": rest, "phase": self.phase}
        self.out.write(json.dumps(line) + "\n")


class Recorder:
    """A ttnn module proxy: calls go to the virtual device and are logged as ``ttnn.<path>``."""

    def __init__(self, target: Any, log: OpLog, path: str = "ttnn") -> None:
        self._target, self._log, self._path = target, log, path

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        path = f"{self._path}.{name}"
        if isinstance(value, SimpleNamespace) and all(
            callable(v) or isinstance(v, SimpleNamespace) for v in vars(value).values()
        ):
            return Recorder(value, self._log, path)
        if callable(value) and not isinstance(value, type):
            log = self._log

            def call(*args: Any, **kwargs: Any) -> Any:
                log.record(path, args, kwargs)
                return value(*args, **kwargs)

            return call
        return value
