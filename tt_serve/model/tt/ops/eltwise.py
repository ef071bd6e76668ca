"""Elementwise and reduction ops: the embedding gather, ``rms_norm``, binary and unary math,
``where``, comparisons, ``sum``, ``softmax``, ``topk`` and ``argmax``."""

from __future__ import annotations

from tt_serve.model.tt.ops.device import DeviceOps, Tensor


class EltwiseOps(DeviceOps):
    """Elementwise math, reductions and sampling."""

    def embedding(self, ids: Tensor, weight: Tensor) -> Tensor:
        return self.ttnn.embedding(ids, weight, layout=self.ttnn.TILE_LAYOUT)

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        return self.ttnn.rms_norm(x, epsilon=eps, weight=weight)

    def add(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.add(a, b)

    def sub(self, a: Tensor | float, b: Tensor) -> Tensor:
        return self.ttnn.sub(a, b)

    def mul(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.mul(a, b)

    def sigmoid(self, x: Tensor) -> Tensor:
        return self.ttnn.sigmoid(x)

    def silu(self, x: Tensor) -> Tensor:
        return self.ttnn.silu(x)

    def softplus(self, x: Tensor) -> Tensor:
        return self.ttnn.softplus(x, beta=1.0, threshold=20.0)

    def rsqrt(self, x: Tensor) -> Tensor:
        return self.ttnn.rsqrt(x)

    def reciprocal(self, x: Tensor) -> Tensor:
        return self.ttnn.reciprocal(x)

    def sum(self, x: Tensor, dim: int) -> Tensor:
        return self.ttnn.sum(x, dim, keepdim=True)

    def softmax(self, x: Tensor) -> Tensor:
        return self.ttnn.softmax(x, -1, numeric_stable=True)

    def where(
        self,
        predicate: Tensor,
        true_value: Tensor | float,
        false_value: Tensor | float,
        *,
        out: Tensor | None = None,
    ) -> Tensor:
        """``predicate ? true_value : false_value``: a select, so NaN or Inf in the operand not
        taken does not leak (a multiply by a 0/1 mask would: 0 x NaN = NaN). ``out``: written
        in place (elementwise, so it may be one of the inputs)."""
        return self.ttnn.where(predicate, true_value, false_value, output_tensor=out)

    def exp(self, x: Tensor) -> Tensor:
        return self.ttnn.exp(x)

    def log(self, x: Tensor) -> Tensor:
        return self.ttnn.log(x)

    def ge(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.ge(a, b)

    def gt(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.gt(a, b)

    def le(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.le(a, b)

    def lt(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.lt(a, b)

    def eq(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.eq(a, b)

    def topk(
        self, x: Tensor, k: int, *, labels: Tensor | None = None, stable: bool = False
    ) -> tuple[Tensor, Tensor]:
        """The k largest along the last dim, sorted: values and their positions (``labels``:
        the labels at those positions instead, ttnn's ``indices_tensor``). ``stable``: ties
        lowest position first (not allowed with labels); otherwise their order is unspecified."""
        values, indices = self.ttnn.topk(x, k, -1, True, True, indices_tensor=labels, stable=stable)
        return values, indices

    def argmax(self, logits: Tensor) -> Tensor:
        """Greedy ids on the device: UINT32, ROW_MAJOR (the multi-core argmax wants RM input)."""
        return self.ttnn.argmax(self.ttnn.to_layout(logits, self.ttnn.ROW_MAJOR_LAYOUT), dim=-1)
