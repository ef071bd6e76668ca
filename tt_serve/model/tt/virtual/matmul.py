"""Matmul (``linear``, ``matmul``) and the compute kernel config (math fidelity) ops take."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tt_serve.model.tt.virtual import rules_matmul
from tt_serve.model.tt.virtual.base import DeviceBase
from tt_serve.model.tt.virtual.tensors import (
    ContractViolation,
    DataType,
    Tensor,
)


class MatmulOps(DeviceBase):
    """Matmuls and their compute kernel config."""

    MathFidelity = SimpleNamespace(LoFi="LoFi", HiFi2="HiFi2", HiFi3="HiFi3", HiFi4="HiFi4")

    def WormholeComputeKernelConfig(
        self,
        *,
        math_fidelity: str = "Invalid",
        math_approx_mode: bool = True,
        fp32_dest_acc_en: bool = False,
        packer_l1_acc: bool = False,
        dst_full_sync_en: bool = False,
    ) -> Any:
        """ttnn.WormholeComputeKernelConfig (also the Blackhole one in 0.81.1)."""
        if math_fidelity not in ("LoFi", "HiFi2", "HiFi3", "HiFi4"):
            raise ContractViolation("dtype", f"math_fidelity {math_fidelity!r}")
        return SimpleNamespace(
            kind="compute_kernel_config",
            math_fidelity=math_fidelity,
            math_approx_mode=math_approx_mode,
            fp32_dest_acc_en=fp32_dest_acc_en,
            packer_l1_acc=packer_l1_acc,
        )

    def linear(self, a: Tensor, b: Tensor, *, compute_kernel_config: Any = None) -> Tensor:
        return self.matmul(a, b, compute_kernel_config=compute_kernel_config)

    def matmul(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_kernel_config: Any = None,
        dtype: DataType | None = None,
    ) -> Tensor:
        """Batch dims as ``rules_matmul.matmul`` allows (B broadcast when its batch is 1, else
        equal); the output dtype is ``dtype`` or, as in ttnn, A's."""
        self._compute_kernel_config("matmul", compute_kernel_config)
        with self._rules():
            rules_matmul.matmul(a.info(), b.info())
        return self._single(
            "matmul", [a, b], lambda: a.buffer.data @ b.buffer.data, dtype or a.dtype
        )
