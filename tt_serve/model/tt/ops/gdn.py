"""Gated DeltaNet: the fused QKV causal conv1d + SiLU and its program config, the chunked
(prefill) and fused recurrent (decode) gated delta rules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tt_serve.model.tt.ops.device import DeviceOps, Tensor


class GdnOps(DeviceOps):
    """Gated DeltaNet's conv and delta rules."""

    def conv_program_config(self, channel_chunk: int) -> Any:
        return self.ttnn.QkvCausalConv1dSiluProgramConfig(channel_chunk_size=channel_chunk)

    def qkv_causal_conv1d_silu(
        self,
        x: Tensor,
        history: Tensor,
        taps: Sequence[Tensor],
        widths: tuple[int, int, int],
        *,
        start: Tensor,
        program_config: Any,
    ) -> tuple[Tensor, Tensor, Tensor]:
        tap0, tap1, tap2, tap3 = taps
        q, k, v = self.ttnn.experimental.kda.qkv_causal_conv1d_silu(
            x,
            history,
            tap0,
            tap1,
            tap2,
            tap3,
            widths[0],
            widths[1],
            widths[2],
            program_config=program_config,
            actual_start=start,
            predecessor_carry=history,  # single device: the local history is the carry
        )
        return q, k, v

    def chunk_gated_delta_rule(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        *,
        state: Tensor,
        scale: float,
        chunk_size: int,
        consts: tuple[Tensor, Tensor, Tensor, Tensor],
    ) -> tuple[Tensor, Tensor]:
        eye, tril, ones, masks = consts
        o, final = self.ttnn.transformer.chunk_gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            scale=scale,
            initial_state=state,
            output_final_state=True,
            chunk_size=chunk_size,
            eye=eye,
            tril=tril,
            ones=ones,
            masks=masks,
        )
        return o, final

    def fused_recurrent_gated_delta_rule(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        *,
        state: Tensor,
        scale: float,
    ) -> tuple[Tensor, Tensor]:
        o, final = self.ttnn.transformer.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, scale=scale, initial_state=state, output_final_state=True
        )
        return o, final
