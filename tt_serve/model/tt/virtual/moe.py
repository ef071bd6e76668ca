"""MoE experts: ``sparse_matmul`` (the scan modes) and its 1-D multicast program config."""

from __future__ import annotations

from typing import Any

import torch

from tt_serve.model.tt.virtual import rules_moe
from tt_serve.model.tt.virtual.base import DeviceBase
from tt_serve.model.tt.virtual.tensors import (
    ContractViolation,
    DataType,
    Tensor,
)


class MoeOps(DeviceBase):
    """Sparse matmul for MoE experts."""

    def MatmulMultiCoreReuseMultiCast1DProgramConfig(
        self,
        *,
        compute_with_storage_grid_size: Any,
        in0_block_w: int,
        out_subblock_h: int,
        out_subblock_w: int,
        out_block_h: int | None = None,
        out_block_w: int | None = None,
        per_core_M: int,
        per_core_N: int,
        fuse_batch: bool,
        fused_activation: Any = None,
        mcast_in0: bool,
        gather_in0: bool = False,
        hop_cores: Any = None,
        num_global_cb_receivers: int = 1,
        untilize_out: bool = False,
        allowed_worker_cores: Any = None,
        stream_in1: bool = False,
    ) -> rules_moe.Matmul1DConfig:
        """ttnn.MatmulMultiCoreReuseMultiCast1DProgramConfig (the 0.81.1 signature); unset
        out_block_h / out_block_w are per_core_M / per_core_N, as tt-metal defaults them
        (ttnn/cpp/ttnn/operations/matmul/device/config/matmul_program_config_types.hpp).
        Fused activations, gathered in0, untilized output and streamed in1 are not modelled."""
        if fused_activation is not None or gather_in0 or untilize_out or stream_in1:
            raise ContractViolation(
                "not_modelled", "1D program config: fused_activation / gather_in0 / untilize_out"
            )
        grid = compute_with_storage_grid_size
        return rules_moe.Matmul1DConfig(
            (grid.x, grid.y),
            in0_block_w,
            out_subblock_h,
            out_subblock_w,
            per_core_M if out_block_h is None else out_block_h,
            per_core_N if out_block_w is None else out_block_w,
            per_core_M,
            per_core_N,
            fuse_batch,
            mcast_in0,
        )

    def sparse_matmul(
        self,
        input_tensor_a: Tensor,
        input_tensor_b: Tensor,
        *,
        sparsity: Tensor,
        program_config: rules_moe.Matmul1DConfig | None = None,
        nnz: int | None = None,
        is_input_a_sparse: bool = False,
        is_input_b_sparse: bool = True,
        memory_config: Any = None,
        dtype: DataType | None = None,
        compute_kernel_config: Any = None,
        core_grid: Any = None,
        output_tile: Any = None,
        optional_output_tensor: Tensor | None = None,
        global_cb: Any = None,
        sub_device_id: Any = None,
        indices: Tensor | None = None,
        bias: Tensor | None = None,
    ) -> Tensor:
        """ttnn.sparse_matmul in the scan modes (no ``indices``, op-owned expanded output), rules
        in ``rules_moe.sparse_matmul``. Batch entry (i, e) is A's block times B's expert e where the
        sparsity entry is non-zero; the op zero-fills the entries it skips (0.81.1 docstring:
        "skipped positions are zero-filled", create_output_tensors' zeros_like, tt-metal PR
        #36714: an unfilled output gave different users different outputs in GPT-OSS), and never
        reads their operands, so garbage there does not leak. ``nnz`` must equal
        count_nonzero(sparsity) at every run, replays included (rule ``sparse_matmul.nnz``: the
        device deadlocks otherwise, #45943). Each run is recorded in ``sparse_matmul_work``
        (the plan and the entries computed; None in shape-only mode, where the values are
        unknown)."""
        unmodelled = (core_grid, output_tile, optional_output_tensor, global_cb, indices, bias)
        if any(v is not None for v in unmodelled) or sub_device_id is not None:
            raise ContractViolation(
                "not_modelled", "sparse_matmul: only the scan modes with an op-owned output"
            )
        a, b, s = input_tensor_a, input_tensor_b, sparsity
        for t in (a, b, s):
            if t.buffer.sharded:
                raise ContractViolation("sparse_matmul.memory", "inputs must be interleaved")
        self._compute_kernel_config("sparse_matmul", compute_kernel_config)
        with self._rules():
            plan = rules_moe.sparse_matmul(
                self.chip,
                a.info(),
                b.info(),
                s.info(),
                program_config,
                nnz=nnz,
                is_input_a_sparse=is_input_a_sparse,
                is_input_b_sparse=is_input_b_sparse,
            )
        if "sparse_matmul_work" not in self.__dict__:
            self.sparse_matmul_work: list[tuple[rules_moe.SparseMatmulPlan, int | None]] = []
        work = self.sparse_matmul_work

        def fn() -> torch.Tensor:
            ad, bd, sd = a.buffer.data, b.buffer.data, s.buffer.data
            if ad.is_meta:
                work.append((plan, None))
                return torch.empty(plan.shape, device="meta")
            active = int((sd != 0).sum())
            if nnz is not None and active != nnz:
                raise ContractViolation(
                    "sparse_matmul.nnz",
                    f"nnz={nnz} but the sparsity tensor has {active} non-zero entries: the "
                    "device deadlocks (tt-metal #45943); pass nnz=None under trace",
                )
            work.append((plan, active))
            if is_input_a_sparse and is_input_b_sparse:
                full, keep = ad @ bd, sd.reshape(1, -1, 1, 1) != 0
            elif is_input_b_sparse:  # [A, B, 1, E, M, N]
                full = ad[:, :, None, None] @ bd[None]
                keep = (sd != 0)[..., None, None]
            else:  # [A, E, M, N]
                full, keep = ad @ bd, (sd[0, 0] != 0)[..., None, None]
            return torch.where(keep, full, torch.zeros(()))

        assert program_config is not None  # rules_moe.sparse_matmul refuses None
        cores = program_config.grid[0] * program_config.grid[1]
        return self._single("sparse_matmul", [a, b, s], fn, dtype or a.dtype, cores=cores)
