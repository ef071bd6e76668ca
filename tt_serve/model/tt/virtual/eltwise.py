"""Elementwise and reduction ops: binary (with broadcast) and unary math, ``where``,
``rms_norm``, ``softmax``, ``topk``, ``argmax`` and ``embedding``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tt_serve.model.tt.virtual import rules_eltwise
from tt_serve.model.tt.virtual.base import DeviceBase
from tt_serve.model.tt.virtual.tensors import (
    Buffer,
    ContractViolation,
    DataType,
    Layout,
    Ref,
    Tensor,
)

# The binary ops giving 0 / 1 (as floats).
COMPARISONS = ("ge", "gt", "le", "lt", "eq")


class EltwiseOps(DeviceBase):
    """Elementwise math, reductions, topk, argmax, embedding."""

    def embedding(self, ids: Tensor, weight: Tensor, *, layout: Layout | None = None) -> Tensor:
        if ids.dtype is not DataType.UINT32 or ids.layout is not Layout.ROW_MAJOR:
            raise ContractViolation(
                "dtype", f"embedding ids must be UINT32 ROW_MAJOR, got {ids.dtype}"
            )
        return self._single(
            "embedding",
            [ids, weight],
            lambda: F.embedding(ids.buffer.data, weight.buffer.data),
            weight.dtype,
            layout or Layout.ROW_MAJOR,
        )

    def rms_norm(self, x: Tensor, *, epsilon: float, weight: Tensor) -> Tensor:
        def fn() -> torch.Tensor:
            d = x.buffer.data
            if d.is_meta:  # shape-only: x's shape
                return torch.empty_like(d, dtype=torch.result_type(d, weight.buffer.data))
            return (
                d
                * torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + epsilon)
                * weight.buffer.data.reshape(-1)
            )

        return self._single("rms_norm", [x, weight], fn, x.dtype)

    def _binary(self, name: str, a: Any, b: Any, f: Callable[[Any, Any], torch.Tensor]) -> Tensor:
        """An eltwise binary op (binary_ng): TILE operands broadcast as ``rules_eltwise.binary``
        allows; comparisons give 0/1 in the first tensor's dtype."""
        ts = [t for t in (a, b) if isinstance(t, Tensor)]
        for t in ts:
            if t.layout is not Layout.TILE:
                raise ContractViolation("tile", f"{name} on a ROW_MAJOR tensor")
        if len(ts) == 2:
            with self._rules():
                rules_eltwise.binary(ts[0].shape, ts[1].shape)

        def val(v: Any) -> Any:
            return v.buffer.data if isinstance(v, (Tensor, Ref)) else v

        def fn() -> torch.Tensor:
            x, y = val(a), val(b)
            held = [v for v in (x, y) if isinstance(v, torch.Tensor)]
            if any(v.is_meta for v in held):  # shape-only: the broadcast shape, f's dtype
                dtype = torch.float32 if name in COMPARISONS else torch.result_type(x, y)
                shape = torch.broadcast_shapes(*(v.shape for v in held))
                return torch.empty(shape, dtype=dtype, device="meta")
            return f(x, y)

        return self._single(name, ts, fn, ts[0].dtype)

    def add(self, a: Any, b: Any) -> Tensor:
        return self._binary("add", a, b, lambda x, y: x + y)

    def sub(self, a: Any, b: Any) -> Tensor:
        return self._binary("sub", a, b, lambda x, y: x - y)

    def mul(self, a: Any, b: Any) -> Tensor:
        return self._binary("mul", a, b, lambda x, y: x * y)

    def ge(self, a: Any, b: Any) -> Tensor:
        return self._binary("ge", a, b, lambda x, y: (x >= y).float())

    def gt(self, a: Any, b: Any) -> Tensor:
        return self._binary("gt", a, b, lambda x, y: (x > y).float())

    def le(self, a: Any, b: Any) -> Tensor:
        return self._binary("le", a, b, lambda x, y: (x <= y).float())

    def lt(self, a: Any, b: Any) -> Tensor:
        return self._binary("lt", a, b, lambda x, y: (x < y).float())

    def eq(self, a: Any, b: Any) -> Tensor:
        return self._binary("eq", a, b, lambda x, y: (x == y).float())

    def _unary(self, name: str, x: Tensor, f: Callable[[torch.Tensor], torch.Tensor]) -> Tensor:
        return self._single(name, [x], lambda: f(x.buffer.data), x.dtype)

    def sigmoid(self, x: Tensor) -> Tensor:
        return self._unary("sigmoid", x, torch.sigmoid)

    def silu(self, x: Tensor) -> Tensor:
        return self._unary("silu", x, F.silu)

    def softplus(self, x: Tensor, *, beta: float, threshold: float) -> Tensor:
        return self._unary("softplus", x, lambda d: F.softplus(d, beta=beta, threshold=threshold))

    def exp(self, x: Tensor) -> Tensor:
        return self._unary("exp", x, torch.exp)

    def log(self, x: Tensor) -> Tensor:
        return self._unary("log", x, torch.log)

    def rsqrt(self, x: Tensor) -> Tensor:
        return self._unary("rsqrt", x, torch.rsqrt)

    def reciprocal(self, x: Tensor) -> Tensor:
        return self._unary("reciprocal", x, torch.reciprocal)

    def sum(self, x: Tensor, dim: int, keepdim: bool = False) -> Tensor:
        return self._unary("sum", x, lambda d: d.sum(dim, keepdim=keepdim))

    def softmax(self, x: Tensor, dim: int = -1, *, numeric_stable: bool = True) -> Tensor:
        return self._unary("softmax", x, lambda d: torch.softmax(d, dim))

    def topk(
        self,
        x: Tensor,
        k: int,
        dim: int = -1,
        largest: bool = True,
        sorted: bool = True,
        *,
        indices_tensor: Tensor | None = None,
        stable: bool = False,
    ) -> list[Tensor]:
        """Values (x's dtype) and indices (``rules_eltwise.topk``'s dtype; the labels of
        ``indices_tensor`` when given), both TILE, sorted. Ties: ``stable`` puts the lowest index
        first (as the 0.81.1 docstring says); otherwise the virtual device orders them highest index
        first, a legal outcome of an unstable sort that differs from the stable one, so code
        that needs an order among ties must ask for it."""
        if not largest or not sorted:
            raise ContractViolation("not_modelled", "topk: only largest=True, sorted=True")
        labels = indices_tensor.info() if indices_tensor is not None else None
        with self._rules():
            kind = rules_eltwise.topk(
                x.info(), k, dim, indices=labels, stable=stable, l1_bytes=self.chip.l1_bytes
            )
        shape = (*list(x.shape)[:-1], k)

        def pick() -> tuple[torch.Tensor, torch.Tensor]:
            d = x.buffer.data
            if d.is_meta:
                return torch.empty(shape, device="meta"), torch.empty(shape, device="meta")
            width = d.shape[-1]
            src = d if stable else d.flip(-1)
            order = torch.sort(src, dim=-1, descending=True, stable=True).indices[..., :k]
            pos = order if stable else width - 1 - order
            idx = pos if indices_tensor is None else indices_tensor.buffer.data.gather(-1, pos)
            return d.gather(-1, pos), idx

        outs: list[Tensor] = []

        def write(res: tuple[torch.Tensor, torch.Tensor]) -> list[Buffer]:
            outs.append(self._out(res[0], x.dtype, Layout.TILE))
            outs.append(self._out(res[1], DataType(kind), Layout.TILE))
            return [o.buffer for o in outs]

        ins = [x] + ([indices_tensor] if indices_tensor is not None else [])
        self._op("topk", ins, pick, write)
        return outs

    def argmax(self, x: Tensor, dim: int | None = None) -> Tensor:
        if x.dtype not in (DataType.BFLOAT16, DataType.FLOAT32):
            raise ContractViolation("dtype", f"argmax input must be bf16/fp32, got {x.dtype}")
        if dim is None and x.layout is not Layout.ROW_MAJOR:
            raise ContractViolation("dtype", "argmax over all dims needs ROW_MAJOR")
        with self._rules():
            self.argmax_paths.append(rules_eltwise.argmax(x.info(), dim))
        return self._single(
            "argmax", [x], lambda: x.buffer.data.argmax(dim=-1), DataType.UINT32, Layout.ROW_MAJOR
        )

    def where(
        self,
        predicate: Tensor,
        true_value: Any,
        false_value: Any,
        *,
        output_tensor: Tensor | None = None,
    ) -> Tensor:
        """ttnn.where: ``predicate ? true_value : false_value`` elementwise, a select (NaN in the
        operand not taken does not leak, unlike a multiply by a 0/1 mask). Values are tensors
        or Python numbers. TILE only; shapes broadcast as ternary_op_utils.cpp
        ``get_broadcast_type`` allows: equal, outer dims only (same H and W), row (H = 1),
        column (W = 1) or scalar ((1, 1) last two dims) with equal outer dims.
        ``output_tensor``: written in place (same shape and dtype as the result), which may be
        one of the inputs (elementwise, tile by tile)."""
        tensors = [t for t in (predicate, true_value, false_value) if isinstance(t, Tensor)]
        if any(t.layout is not Layout.TILE for t in tensors):
            raise ContractViolation("tile", "where operands must be TILE")
        shapes = [tuple(t.shape) for t in tensors]
        if len({len(sh) for sh in shapes}) != 1:
            raise ContractViolation("where.broadcast", f"where of ranks {shapes}")
        out = tuple(max(d) for d in zip(*shapes, strict=True))
        hw = {sh[-2:] for sh in shapes}
        outer_same = len({sh[:-2] for sh in shapes}) == 1
        ok = all(all(d in (1, o) for d, o in zip(sh, out, strict=True)) for sh in shapes) and (
            len(hw) == 1
            or (outer_same and all(sh[-2:] in ((1, 1), out[-2:]) for sh in shapes))
            or (outer_same and len({sh[-1] for sh in shapes}) == 1)
            or (outer_same and len({sh[-2] for sh in shapes}) == 1)
        )
        if not ok:
            raise ContractViolation("where.broadcast", f"where of shapes {shapes}")
        values = [v for v in (true_value, false_value) if isinstance(v, Tensor)]
        dtype = values[0].dtype if values else predicate.dtype

        def fn() -> torch.Tensor:
            def val(v: Any) -> Any:
                return v.buffer.data if isinstance(v, (Tensor, Ref)) else float(v)

            pred = predicate.buffer.data
            if pred.is_meta:
                return torch.empty(out, device="meta")
            return torch.where(pred != 0, val(true_value), val(false_value))

        if output_tensor is not None:
            if output_tensor.shape != out or output_tensor.dtype != dtype:
                raise ContractViolation(
                    "dtype", f"where output_tensor {output_tensor.shape}/{output_tensor.dtype}"
                )
            return self._inplace("where", tensors, output_tensor, fn)
        return self._single("where", tensors, fn, dtype)
