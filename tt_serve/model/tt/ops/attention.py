"""Paged attention: the fused-QKV head split, the paged cache fill (prefill) and update
(decode), the SDPA program config, chunked SDPA over the paged cache and paged SDPA decode."""

from __future__ import annotations

from typing import Any

from tt_serve.model.tt.ops.device import DeviceOps, Tensor


class AttentionOps(DeviceOps):
    """Paged attention and its program config."""

    def create_qkv_heads(
        self, fused: Tensor, num_heads: int, num_kv_heads: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """[1, 1, T, (nh + 2 nkv) hd] -> head-major q [1, nh, T, hd], k and v [1, nkv, T, hd]."""
        q, k, v = self.ttnn.experimental.nlp_create_qkv_heads(
            fused, num_heads=num_heads, num_kv_heads=num_kv_heads, transpose_k_heads=False
        )
        return q, k, v

    def paged_fill_cache(self, cache: Tensor, x: Tensor, page_table: Tensor) -> None:
        self.ttnn.experimental.paged_fill_cache(cache, x, page_table, batch_idx=0)

    def paged_update_cache(
        self, cache: Tensor, x: Tensor, positions: Tensor, page_table: Tensor
    ) -> None:
        self.ttnn.experimental.paged_update_cache(
            cache, x, update_idxs_tensor=positions, page_table=page_table
        )

    def sdpa_program_config(
        self, q_chunk: int, k_chunk: int, *, max_cores_per_head_batch: int = 16
    ) -> Any:
        """SDPA program config on the device grid, exact exp (``exp_approx_mode`` would default
        to true). ``max_cores_per_head_batch=1``: no cross-core tree reduction in paged decode."""
        return self.ttnn.SDPAProgramConfig(
            compute_with_storage_grid_size=self.device.compute_with_storage_grid_size(),
            q_chunk_size=q_chunk,
            k_chunk_size=k_chunk,
            exp_approx_mode=False,
            max_cores_per_head_batch=max_cores_per_head_batch,
        )

    def chunked_sdpa(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        page_table: Tensor,
        chunk_start: Tensor,
        *,
        scale: float,
        program_config: Any,
        compute_config: Any = None,
    ) -> Tensor:
        return self.ttnn.transformer.chunked_scaled_dot_product_attention(
            q,
            k_cache,
            v_cache,
            page_table,
            chunk_start_idx_tensor=chunk_start,
            scale=scale,
            program_config=program_config,
            compute_kernel_config=compute_config,
        )

    def paged_sdpa_decode(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        page_table: Tensor,
        cur_pos: Tensor,
        *,
        scale: float,
        program_config: Any = None,
        compute_config: Any = None,
    ) -> Tensor:
        """``None`` configs: the op's defaults (whole grid, tree reduction, approximate exp)."""
        return self.ttnn.transformer.paged_scaled_dot_product_attention_decode(
            q,
            k_cache,
            v_cache,
            page_table,
            cur_pos_tensor=cur_pos,
            scale=scale,
            program_config=program_config,
            compute_kernel_config=compute_config,
        )
