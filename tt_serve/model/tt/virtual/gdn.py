"""Gated DeltaNet: the fused QKV causal conv1d + SiLU and its program config, the chunked
(prefill) and fused recurrent (decode) gated delta rules."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from tt_serve.model.ref.gdn import chunk_gated_delta, recurrent_gated_delta_step
from tt_serve.model.ref.layers import l2norm
from tt_serve.model.tt.virtual import rules_gdn
from tt_serve.model.tt.virtual.base import DeviceBase
from tt_serve.model.tt.virtual.tensors import (
    Buffer,
    ContractViolation,
    DataType,
    Layout,
    Tensor,
)


class GdnOps(DeviceBase):
    """Gated DeltaNet: conv and the gated delta rules."""

    def QkvCausalConv1dSiluProgramConfig(self, *, channel_chunk_size: int) -> Any:
        return SimpleNamespace(channel_chunk_size=channel_chunk_size)

    def _qkv_conv(
        self,
        x: Tensor,
        history: Tensor,
        tap0: Tensor,
        tap1: Tensor,
        tap2: Tensor,
        tap3: Tensor,
        q_width: int,
        k_width: int,
        v_width: int,
        *,
        program_config: Any,
        actual_start: Tensor,
        predecessor_carry: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        taps = [tap0, tap1, tap2, tap3]
        c = q_width + k_width + v_width
        if history.layout is not Layout.ROW_MAJOR or history.dtype is not DataType.BFLOAT16:
            raise ContractViolation("dtype", "conv history must be ROW_MAJOR BFLOAT16")
        if x.dtype is not DataType.BFLOAT16 or any(
            t.layout is not Layout.TILE or t.dtype is not DataType.BFLOAT16 for t in taps
        ):
            raise ContractViolation("dtype", "conv input and taps must be BFLOAT16 (taps TILE)")
        if actual_start.dtype is not DataType.UINT32:
            raise ContractViolation("dtype", "actual_start must be UINT32")
        if x.shape[1] % 32 or any(w % 32 for w in (q_width, k_width, v_width)) or x.shape[2] != c:
            raise ContractViolation(
                "tile", f"conv T={x.shape[1]} widths={q_width, k_width, v_width}"
            )
        if c % program_config.channel_chunk_size:
            raise ContractViolation("tile", "channel_chunk_size must divide the channels")

        def fn() -> tuple[torch.Tensor, ...]:
            if x.buffer.data.is_meta:
                t = x.shape[1]
                return tuple(
                    torch.empty(1, t, w, device="meta") for w in (q_width, k_width, v_width)
                )
            if int(actual_start.buffer.data.reshape(-1)[0]) % 32:
                raise ContractViolation("tile", "actual_start must be 32-aligned")
            full = torch.cat([history.buffer.data[0], x.buffer.data[0]], 0).T  # [C, 3+T]
            w = torch.stack([t.buffer.data.reshape(-1) for t in taps], 1)[:, None, :]
            out = F.silu(F.conv1d(full[None], w, groups=c)[0]).T[None]  # [1, T, C]
            return tuple(torch.split(out, [q_width, k_width, v_width], -1))

        outs: list[Tensor] = []

        def write(res: tuple[torch.Tensor, ...]) -> list[Buffer]:
            outs.extend(self._out(r, DataType.BFLOAT16, Layout.TILE) for r in res)
            return [o.buffer for o in outs]

        self._op("qkv_causal_conv1d_silu", [x, history, *taps, actual_start], fn, write)
        return outs[0], outs[1], outs[2]

    def _gdr_out(
        self,
        name: str,
        ins: list[Tensor],
        fn: Callable[[], tuple[torch.Tensor, torch.Tensor]],
        o_layout: Layout,
        cores: int,
    ) -> tuple[Tensor, Tensor]:
        outs: list[Tensor] = []

        def write(res: tuple[torch.Tensor, torch.Tensor]) -> list[Buffer]:
            outs.append(self._out(res[0], DataType.FLOAT32, o_layout))
            outs.append(self._out(res[1], DataType.FLOAT32, Layout.TILE))
            return [o.buffer for o in outs]

        self._op(name, ins, fn, write, cores)
        return outs[0], outs[1]

    def _chunk_gdr(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        *,
        scale: float | None = None,
        initial_state: Tensor | None = None,
        output_final_state: bool = False,
        chunk_size: int = 64,
        eye: Tensor | None = None,
        tril: Tensor | None = None,
        ones: Tensor | None = None,
        masks: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        consts = [eye, tril, ones, masks]
        if self.capturing and any(c is None for c in consts):
            raise ContractViolation(
                "runtime_args", "chunk_gated_delta_rule under trace needs eye/tril/ones/masks"
            )
        if any(t.layout is not Layout.TILE for t in (q, k, v, g, beta)):
            raise ContractViolation("tile", "chunk_gated_delta_rule inputs must be TILE")
        if initial_state is None or initial_state.dtype is not DataType.FLOAT32:
            raise ContractViolation("dtype", "initial_state must be FLOAT32")
        b, t = q.shape[0], q.shape[1]
        hv, dv = initial_state.shape[1], initial_state.shape[3]
        if len(q.shape) == 3 and (chunk_size != 32 or t % 32 or initial_state.shape[2] != dv):
            raise ContractViolation(
                "tile", "flat chunk_gated_delta_rule needs chunk 32, T%32==0, K==V"
            )
        with self._rules():
            rules_gdn.chunk_gated_delta_rule(
                self.chip,
                [q.info(), k.info(), v.info()],
                g.info(),
                beta.info(),
                initial_state.info(),
                chunk_size,
                [c.info() for c in consts if c is not None],
            )

        # The flat (rank-3) form takes raw q/k and L2-normalises them in the kernel; the rank-4
        # form expects them normalised already (use_qk_l2norm stays False): the 0.81.1
        # docstring's "Input layouts", and its golden, which normalises only when asked.
        norm = l2norm if len(q.shape) == 3 else (lambda x: x)

        def fn() -> tuple[torch.Tensor, torch.Tensor]:
            dk = initial_state.shape[2]
            if q.buffer.data.is_meta:  # shape-only: out [B, T, Hv, dv], final state [B, Hv, dk, dv]
                return (
                    torch.empty(b, t, hv, dv, device="meta"),
                    torch.empty(b, hv, dk, dv, device="meta"),
                )
            qd = q.buffer.data.reshape(b, t, -1, dk)
            kd = k.buffer.data.reshape(b, t, -1, dk)
            rep = hv // qd.shape[2]
            sc = scale if scale is not None else dk**-0.5
            outs, finals = [], []
            for i in range(b):
                qi = norm(qd[i]).repeat_interleave(rep, 1) * sc
                ki = norm(kd[i]).repeat_interleave(rep, 1)
                vi = v.buffer.data[i].reshape(t, hv, dv)
                o, s = chunk_gated_delta(
                    qi,
                    ki,
                    vi,
                    g.buffer.data[i],
                    beta.buffer.data[i],
                    initial_state.buffer.data[i],
                    chunk=chunk_size,
                )
                outs.append(o)
                finals.append(s)
            return torch.stack(outs), torch.stack(finals)

        ins = [q, k, v, g, beta, initial_state] + [c for c in consts if c is not None]
        return self._gdr_out("chunk_gated_delta_rule", ins, fn, Layout.ROW_MAJOR, b * hv)

    def _recurrent_gdr(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        *,
        scale: float | None = None,
        initial_state: Tensor | None = None,
        output_final_state: bool = False,
    ) -> tuple[Tensor, Tensor]:
        if initial_state is None or initial_state.dtype is not DataType.FLOAT32:
            raise ContractViolation("dtype", "initial_state must be FLOAT32")
        if q.shape[1] != 1:
            raise ContractViolation("dtype", "decode runs one token per row")
        with self._rules():
            rules_gdn.fused_recurrent_gated_delta_rule(
                self.chip, q.info(), v.info(), initial_state.info()
            )

        def fn() -> tuple[torch.Tensor, torch.Tensor]:
            hv, dk = v.shape[2], q.shape[3]
            rep = hv // q.shape[2]
            qd = q.buffer.data[:, 0].repeat_interleave(rep, 1) * (
                scale if scale is not None else dk**-0.5
            )
            kd = k.buffer.data[:, 0].repeat_interleave(rep, 1)
            o, s = recurrent_gated_delta_step(
                qd,
                kd,
                v.buffer.data[:, 0],
                g.buffer.data[:, 0],
                beta.buffer.data[:, 0],
                initial_state.buffer.data,
            )
            return o[:, None], s

        return self._gdr_out(
            "fused_recurrent_gated_delta_rule",
            [q, k, v, g, beta, initial_state],
            fn,
            Layout.TILE,
            q.shape[0] * v.shape[2],
        )
