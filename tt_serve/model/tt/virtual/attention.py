"""Paged attention: the QKV head split, paged cache fill (prefill) and update (decode),
chunked SDPA over a paged cache and paged SDPA decode, with its program config."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from tt_serve.model.tt.virtual import rules_attention
from tt_serve.model.tt.virtual.base import DeviceBase
from tt_serve.model.tt.virtual.tensors import (
    Buffer,
    ContractViolation,
    DataType,
    Layout,
    Tensor,
)


class AttentionOps(DeviceBase):
    """Paged KV caches and SDPA."""

    def SDPAProgramConfig(
        self,
        *,
        compute_with_storage_grid_size: Any,
        q_chunk_size: int,
        k_chunk_size: int,
        exp_approx_mode: bool | None = None,
        max_cores_per_head_batch: int = 16,
    ) -> rules_attention.SdpaConfig:
        grid = compute_with_storage_grid_size
        return rules_attention.SdpaConfig(
            (grid.x, grid.y), q_chunk_size, k_chunk_size, exp_approx_mode, max_cores_per_head_batch
        )

    def _create_qkv_heads(
        self,
        input: Tensor,
        input_kv: Tensor | None = None,
        *,
        num_heads: int,
        num_kv_heads: int | None = None,
        transpose_k_heads: bool = True,
        kv_tied: bool = False,
        memory_config: Any = None,
        output_tensors: Any = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        if input_kv is not None or kv_tied or output_tensors is not None:
            raise ContractViolation(
                "not_modelled", "nlp_create_qkv_heads: only the fused, untied form is modelled"
            )
        nkv = num_heads if num_kv_heads is None else num_kv_heads
        with self._rules():
            qs, _, _ = rules_attention.nlp_create_qkv_heads(
                input.info(), num_heads, nkv, transpose_k_heads
            )
        hd = qs[-1]

        def split() -> tuple[torch.Tensor, ...]:
            d = input.buffer.data
            b, _, n, _ = d.shape
            cuts = (0, num_heads * hd, (num_heads + nkv) * hd, (num_heads + 2 * nkv) * hd)
            heads = (num_heads, nkv, nkv)
            parts = [
                d[..., a:e].reshape(b, n, h, hd).permute(0, 2, 1, 3)
                for (a, e), h in zip(itertools.pairwise(cuts), heads, strict=True)
            ]
            if transpose_k_heads:
                parts[1] = parts[1].transpose(-1, -2)
            return tuple(t.contiguous() for t in parts)

        holder: list[Tensor] = []

        def write(res: tuple[torch.Tensor, ...]) -> list[Buffer]:
            holder.extend(self._out(r, input.dtype, Layout.TILE) for r in res)
            return [t.buffer for t in holder]

        self._op("nlp_create_qkv_heads", [input], split, write)
        return holder[0], holder[1], holder[2]

    def _check_cache(self, cache: Tensor, table: Tensor) -> None:
        if cache.layout is not Layout.TILE or cache.shape[2] % 32 or cache.shape[3] % 32:
            raise ContractViolation(
                "tile", f"paged cache {cache.shape} must be TILE with 32-aligned block/head"
            )
        if table.dtype is not DataType.INT32 or table.layout is not Layout.ROW_MAJOR:
            raise ContractViolation("dtype", "page tables must be INT32 ROW_MAJOR")

    def _paged_fill_cache(
        self, cache: Tensor, x: Tensor, page_table: Tensor, *, batch_idx: int = 0
    ) -> Tensor:
        self._check_cache(cache, page_table)
        if x.dtype != cache.dtype:
            raise ContractViolation(
                "dtype", f"paged_fill_cache input {x.dtype} != cache {cache.dtype}"
            )
        if x.shape[2] % 32:
            raise ContractViolation("tile", f"paged_fill_cache of {x.shape[2]} tokens")
        with self._rules():
            rules_attention.paged_fill_cache(cache.info(), x.info(), page_table.info(), batch_idx)

        def fn() -> torch.Tensor:
            new, bs = cache.buffer.data.clone(), cache.shape[2]
            t = x.shape[2]
            pos = torch.arange(t)
            blocks = page_table.buffer.data[batch_idx, pos // bs]
            new[blocks, :, pos % bs] = x.buffer.data[0].permute(1, 0, 2)
            return new

        return self._inplace("paged_fill_cache", [x, page_table], cache, fn)

    def _paged_update_cache(
        self,
        cache: Tensor,
        x: Tensor,
        *,
        update_idxs: Sequence[int] = (),
        update_idxs_tensor: Tensor | None = None,
        page_table: Tensor | None = None,
    ) -> Tensor:
        if update_idxs_tensor is None:
            if self.capturing:
                raise ContractViolation(
                    "runtime_args", "paged_update_cache positions as a list under trace"
                )
            raise ContractViolation("runtime_args", "pass positions as update_idxs_tensor")
        assert page_table is not None
        self._check_cache(cache, page_table)
        if not x.buffer.sharded:
            raise ContractViolation("dtype", "paged_update_cache input must be height-sharded")
        if update_idxs_tensor.dtype is not DataType.INT32:
            raise ContractViolation("dtype", "update_idxs_tensor must be INT32")
        with self._rules():
            rules_attention.paged_update_cache(
                self.chip, cache.info(), x.info(), update_idxs_tensor.info(), page_table.info()
            )

        def fn() -> torch.Tensor:
            new, bs = cache.buffer.data.clone(), cache.shape[2]
            for b, p in enumerate(update_idxs_tensor.buffer.data.tolist()):
                if p >= 0:
                    new[page_table.buffer.data[b, p // bs], :, p % bs] = x.buffer.data[0, b]
            return new

        return self._inplace(
            "paged_update_cache", [x, update_idxs_tensor, page_table], cache, fn, x.shape[1]
        )

    @staticmethod
    def _attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
    ) -> torch.Tensor:
        scores = (q @ k.transpose(-1, -2)) * scale
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return probs @ v

    @staticmethod
    def _gather(cache: torch.Tensor, row: torch.Tensor, length: int) -> torch.Tensor:
        g = cache[row]  # [W, kvh, bs, hd]
        return g.permute(1, 0, 2, 3).reshape(cache.shape[1], -1, cache.shape[3])[:, :length]

    def _chunked_sdpa(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        page_table: Tensor,
        chunk_start_idx: int | None = None,
        *,
        chunk_start_idx_tensor: Tensor | None = None,
        scale: float | None = None,
        program_config: Any = None,
        compute_kernel_config: Any = None,
    ) -> Tensor:
        self._compute_kernel_config("chunked_sdpa", compute_kernel_config)
        if chunk_start_idx_tensor is None:
            if self.capturing:
                raise ContractViolation("runtime_args", "chunk start as a Python int under trace")
        elif chunk_start_idx_tensor.dtype is not DataType.INT32:
            raise ContractViolation("dtype", "chunk_start_idx_tensor must be INT32")
        self._check_cache(k, page_table)
        t, hd = q.shape[2], q.shape[3]
        if t % 32:
            raise ContractViolation("tile", f"chunked SDPA chunk of {t} tokens")
        start_info = chunk_start_idx_tensor.info() if chunk_start_idx_tensor is not None else None
        with self._rules():
            rules_attention.chunked_sdpa(
                q.info(), k.info(), v.info(), page_table.info(), start_info, program_config
            )
        qc = program_config.q_chunk_size if program_config is not None else 32
        kc = program_config.k_chunk_size if program_config is not None else 32
        sc = scale if scale is not None else hd**-0.5

        def fn() -> torch.Tensor:
            if q.buffer.data.is_meta:
                return torch.empty(q.shape, device="meta")
            start = (
                int(chunk_start_idx_tensor.buffer.data.reshape(-1)[0])
                if chunk_start_idx_tensor is not None
                else int(chunk_start_idx or 0)
            )
            with self._rules():
                rules_attention.chunked_sdpa_start(start, qc, kc)
            end = start + t
            row = page_table.buffer.data[0]
            keys = self._gather(k.buffer.data, row, end)
            vals = self._gather(v.buffer.data, row, end)
            rep = q.shape[1] // keys.shape[0]
            keys, vals = keys.repeat_interleave(rep, 0), vals.repeat_interleave(rep, 0)
            mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
            return self._attend(q.buffer.data[0], keys, vals, mask, sc)[None]

        ins = [q, k, v, page_table] + (
            [chunk_start_idx_tensor] if chunk_start_idx_tensor is not None else []
        )
        return self._single("chunked_sdpa", ins, fn, q.dtype)

    def _sdpa_decode(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        page_table: Tensor,
        *,
        cur_pos_tensor: Tensor | None = None,
        scale: float | None = None,
        program_config: rules_attention.SdpaConfig | None = None,
        compute_kernel_config: Any = None,
    ) -> Tensor:
        self._compute_kernel_config("sdpa_decode", compute_kernel_config)
        if cur_pos_tensor is None or cur_pos_tensor.dtype is not DataType.INT32:
            raise ContractViolation(
                "runtime_args", "decode positions must be an INT32 cur_pos_tensor"
            )
        self._check_cache(k, page_table)
        with self._rules():
            plan = rules_attention.paged_sdpa_decode(
                self.chip,
                q.info(),
                k.info(),
                v.info(),
                page_table.info(),
                cur_pos_tensor.info(),
                program_config,
                require_program_config=self.require_sdpa_program_config,
            )
        self.sdpa_decode_plans.append(plan)
        active = plan.cores_per_head * k.shape[1] * plan.batch // plan.heads_per_core
        b, nh, hd = q.shape[1], q.shape[2], q.shape[3]
        sc = scale if scale is not None else hd**-0.5

        def fn() -> torch.Tensor:
            out = torch.zeros(1, b, -(-nh // 32) * 32, hd, device=q.buffer.data.device)
            if out.is_meta:
                return out
            for i, p in enumerate(cur_pos_tensor.buffer.data.tolist()):
                if p < 0:
                    continue
                row = page_table.buffer.data[i]
                keys = self._gather(k.buffer.data, row, p + 1)
                vals = self._gather(v.buffer.data, row, p + 1)
                rep = nh // keys.shape[0]
                qi = q.buffer.data[0, i].reshape(keys.shape[0], rep, hd)
                mask = torch.ones(rep, p + 1, dtype=torch.bool)
                out[0, i, :nh] = self._attend(qi, keys, vals, mask, sc).reshape(nh, hd)
            return out

        ins = [q, k, v, page_table, cur_pos_tensor]
        return self._single(
            "sdpa_decode", ins, fn, q.dtype, cores=min(active, plan.cores_available)
        )
