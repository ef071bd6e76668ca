"""The one thin adapter through which every ttnn call of the backend goes: :class:`Ops`, one op
family a module (``device.py`` the device, dtypes and traces, every family's base; ``host.py``
host <-> device; ``movement.py``, ``eltwise.py``, ``matmul.py``, ``attention.py``, ``gdn.py``,
``ccl.py``), composed here.

``Ops`` wraps a ttnn module handle: the real package (``Ops.load()``, imported lazily so that
``import tt_serve.model.tt`` works without ttnn) or, in tests, a contract fake with the same
surface. Methods are deliberately one call deep, keyword names exactly as in ttnn 0.81.1, so
``tests/tt_host`` can check every ``self.ttnn.<op>(..., kw=...)`` written here against the real
nanobind signatures. Device tensors are opaque (``Tensor = Any``); host data is numpy.

Rules this package keeps (see tt-metal's trace tech report): nothing here reads or writes the host
while a trace is being captured (the callers only use ``write``/``read`` outside captures), a
non-blocking read (``read_start``) is converted only after its event has completed, and
ops used under trace take every runtime value as a device tensor (chunk start, positions, page
tables, constant tiles), never a Python int that would be baked into the captured program.
"""

from __future__ import annotations

from tt_serve.model.tt.ops.attention import AttentionOps
from tt_serve.model.tt.ops.ccl import CclOps
from tt_serve.model.tt.ops.device import DEFAULT_L1_SMALL, DeviceOps, MemoryView, Tensor
from tt_serve.model.tt.ops.eltwise import EltwiseOps
from tt_serve.model.tt.ops.gdn import GdnOps
from tt_serve.model.tt.ops.host import HostOps, PendingRead
from tt_serve.model.tt.ops.matmul import MatmulOps
from tt_serve.model.tt.ops.movement import MovementOps

__all__ = ["DEFAULT_L1_SMALL", "MemoryView", "Ops", "PendingRead", "Tensor"]


class Ops(
    HostOps,
    MovementOps,
    EltwiseOps,
    MatmulOps,
    AttentionOps,
    GdnOps,
    CclOps,
    DeviceOps,
):
    """ttnn, one method per op. ``device`` is set by :meth:`open_device`."""

    @classmethod
    def load(cls) -> Ops:
        """The real ttnn (raises ImportError when it is not installed)."""
        import ttnn

        return cls(ttnn)
