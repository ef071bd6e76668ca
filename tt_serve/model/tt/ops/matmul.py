"""Matmuls: ``linear``, ``matmul``, the MoE experts' ``sparse_matmul`` with its 1-D multicast
program config, and the compute kernel config (math fidelity) they take."""

from __future__ import annotations

from typing import Any

from tt_serve.model.tt.ops.device import DeviceOps, Tensor


class MatmulOps(DeviceOps):
    """Matmuls and their configs."""

    def linear(self, x: Tensor, w: Tensor, compute_config: Any = None) -> Tensor:
        """x [..., in] @ w [in, out] (weights are stored transposed, as ttnn expects);
        ``compute_config`` from :meth:`compute_config` (None: the op's default, HiFi2)."""
        return self.ttnn.linear(x, w, compute_kernel_config=compute_config)

    def matmul(
        self, a: Tensor, b: Tensor, compute_config: Any = None, *, dtype: str | None = None
    ) -> Tensor:
        """a [..., M, K] @ b [..., K, N]. ``dtype``: the output's (None: a's dtype, ttnn's
        default, which is wrong when a is a block-float weight)."""
        out_dtype = self.dtype(dtype) if dtype is not None else None
        return self.ttnn.matmul(a, b, compute_kernel_config=compute_config, dtype=out_dtype)

    def matmul_1d_config(
        self, *, cores: tuple[int, int], in0_block_w: int, per_core_m: int, per_core_n: int
    ) -> Any:
        """A 1D multicast program config with in0 multicast (the one config sparse_matmul
        takes): ``cores`` (x, y) of the grid, 1x1 output subblocks, one output block per core."""
        t = self.ttnn
        return t.MatmulMultiCoreReuseMultiCast1DProgramConfig(
            compute_with_storage_grid_size=t.CoreCoord(cores[0], cores[1]),
            in0_block_w=in0_block_w,
            out_subblock_h=1,
            out_subblock_w=1,
            out_block_h=1,
            out_block_w=1,
            per_core_M=per_core_m,
            per_core_N=per_core_n,
            fuse_batch=False,
            fused_activation=None,
            mcast_in0=True,
        )

    def sparse_matmul(
        self,
        a: Tensor,
        b: Tensor,
        sparsity: Tensor,
        *,
        program_config: Any,
        a_sparse: bool,
        b_sparse: bool,
        compute_config: Any = None,
        dtype: str | None = None,
    ) -> Tensor:
        """Batched a @ b computed only where ``sparsity`` (bf16 ROW_MAJOR, rank 4) is non-zero,
        zeros elsewhere (ttnn's mode table: ``rules_moe.sparse_matmul``). ``nnz`` stays None: the
        op counts the non-zero entries on the device, so a trace replays with any routing."""
        out_dtype = self.dtype(dtype) if dtype is not None else None
        return self.ttnn.sparse_matmul(
            a,
            b,
            sparsity=sparsity,
            program_config=program_config,
            nnz=None,
            is_input_a_sparse=a_sparse,
            is_input_b_sparse=b_sparse,
            compute_kernel_config=compute_config,
            dtype=out_dtype,
        )

    def compute_config(self, fidelity: str, *, fp32_acc: bool = False) -> Any:
        """A compute kernel config: math fidelity ``LoFi``/``HiFi2``/``HiFi4``, approximate SFPU
        math off, fp32 accumulation in the dest registers when ``fp32_acc``."""
        t = self.ttnn
        fidelities = {
            "LoFi": t.MathFidelity.LoFi,
            "HiFi2": t.MathFidelity.HiFi2,
            "HiFi4": t.MathFidelity.HiFi4,
        }
        return t.WormholeComputeKernelConfig(
            math_fidelity=fidelities[fidelity],
            math_approx_mode=False,
            fp32_dest_acc_en=fp32_acc,
            packer_l1_acc=False,
        )
