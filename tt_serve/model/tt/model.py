"""The hybrid decoder stack on the device (mirrors ``ref/model.py``).

Two programs, each a pure function of persistent buffers so it can be captured as a trace:
``prefill`` runs one row of a bucket through every layer (state in the working buffers) and
``decode`` runs every state slot as one batch row (slot s in row s; state in the pools). Both
end by picking the greedy token on the device (argmax to uint32) and copying ids and logits
into their output buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tt_serve.model.spec import FULL_ATTENTION, ModelSpec
from tt_serve.model.tt.attention import AttentionWeights, attention_decode, attention_prefill
from tt_serve.model.tt.buffers import InputBuffers
from tt_serve.model.tt.gdn import KERNEL_CHUNK, GdnWeights, gdn_decode, gdn_prefill
from tt_serve.model.tt.inputs import gdn_const_tiles, rotation_matrix
from tt_serve.model.tt.layers import swiglu
from tt_serve.model.tt.moe import MoeWeights, moe_forward
from tt_serve.model.tt.ops import Ops, Tensor
from tt_serve.model.tt.pools import DevicePools

SDPA_QK_CHUNK = 32  # chunk starts are multiples of the block size, hence of 32


@dataclass(frozen=True)
class Layer:
    input_norm: Tensor
    post_norm: Tensor
    mixer: GdnWeights | AttentionWeights
    mlp: tuple[Tensor, Tensor, Tensor] | MoeWeights
    pool_index: int


class TTModel:
    """Device weights plus the two traceable programs; all sequence state lives in pools."""

    def __init__(self, ops: Ops, spec: ModelSpec, w: dict[str, Tensor]) -> None:
        self.ops, self.spec = ops, spec
        self.embed, self.norm, self.lm_head = w["embed"], w["norm"], w["lm_head"]
        self.layers = [self._layer(spec, w, i) for i in range(spec.num_layers)]
        self.rot = ops.upload(rotation_matrix(spec.head_dim, spec.rotary_dim), "bfloat16")
        eye, tril, ones, masks = (ops.upload(a, "float32") for a in gdn_const_tiles(KERNEL_CHUNK))
        self.gdn_consts = (eye, tril, ones, masks)
        self.sdpa_config: Any = ops.sdpa_program_config(SDPA_QK_CHUNK, SDPA_QK_CHUNK)
        self.conv_config: Any = ops.conv_program_config(_channel_chunk(spec.conv_dim))
        # fused_recurrent_gated_delta_rule puts one core per (row, value head) and refuses more
        # than the grid (its program factory's TT_FATAL): decode runs it in row groups.
        self.gdn_rows_per_call = max(
            1, ops.num_worker_cores() // max(spec.linear_num_value_heads, 1)
        )

    @staticmethod
    def _layer(spec: ModelSpec, w: dict[str, Tensor], i: int) -> Layer:
        p = f"{i}."
        mixer: GdnWeights | AttentionWeights
        if spec.layer_types[i] == FULL_ATTENTION:
            mixer = AttentionWeights(
                q=w[p + "q"],
                gate=w[p + "gate"],
                k=w[p + "k"],
                v=w[p + "v"],
                o=w[p + "o"],
                q_norm=w[p + "q_norm"],
                k_norm=w[p + "k_norm"],
                num_heads=spec.num_attention_heads,
                num_kv_heads=spec.num_kv_heads,
                head_dim=spec.head_dim,
                eps=spec.rms_norm_eps,
            )
            rank = spec.attention_layers.index(i)
        else:
            mixer = GdnWeights(
                qkv=w[p + "qkv"],
                z=w[p + "z"],
                b=w[p + "b"],
                a=w[p + "a"],
                out=w[p + "out"],
                norm=w[p + "gdn_norm"],
                taps=(w[p + "tap0"], w[p + "tap1"], w[p + "tap2"], w[p + "tap3"]),
                dt_bias=w[p + "dt_bias"],
                neg_a=w[p + "neg_a"],
                num_k_heads=spec.linear_num_key_heads,
                num_v_heads=spec.linear_num_value_heads,
                head_k_dim=spec.linear_key_head_dim,
                head_v_dim=spec.linear_value_head_dim,
                eps=spec.rms_norm_eps,
            )
            rank = spec.gdn_layers.index(i)
        mlp: tuple[Tensor, Tensor, Tensor] | MoeWeights
        if spec.is_moe_layer(i):
            mlp = MoeWeights(
                router=w[p + "router"],
                experts=tuple(
                    (w[p + f"e{e}.gate"], w[p + f"e{e}.up"], w[p + f"e{e}.down"])
                    for e in range(spec.num_experts)
                ),
                shared=(w[p + "shared.gate"], w[p + "shared.up"], w[p + "shared.down"]),
                shared_gate=w[p + "shared_gate"],
                top_k=spec.num_experts_per_tok,
                norm_topk_prob=spec.norm_topk_prob,
            )
        else:
            mlp = (w[p + "mlp.gate"], w[p + "mlp.up"], w[p + "mlp.down"])
        return Layer(w[p + "input_norm"], w[p + "post_norm"], mixer, mlp, rank)

    def _mlp(self, x: Tensor, layer: Layer) -> Tensor:
        if isinstance(layer.mlp, MoeWeights):
            return moe_forward(self.ops, x, layer.mlp)
        return swiglu(self.ops, x, *layer.mlp)

    def _head(self, h: Tensor, inp: InputBuffers) -> None:
        ops = self.ops
        logits = ops.typecast(
            ops.linear(ops.rms_norm(h, self.norm, self.spec.rms_norm_eps), self.lm_head), "float32"
        )
        ops.copy(logits, inp.out_logits)
        ops.copy(ops.argmax(logits), inp.out_ids)

    def prefill(self, inp: InputBuffers, pools: DevicePools) -> None:
        """One bucket of one row through all layers; state in ``pools.*_work``."""
        ops, eps = self.ops, self.spec.rms_norm_eps
        x = ops.embedding(inp.ids, self.embed)  # [1, T, H]
        for layer in self.layers:
            h = ops.rms_norm(x, layer.input_norm, eps)
            j = layer.pool_index
            if isinstance(layer.mixer, GdnWeights):
                h = gdn_prefill(
                    ops,
                    h,
                    layer.mixer,
                    inp,
                    pools.conv_work[j],
                    pools.rec_work[j],
                    self.gdn_consts,
                    self.conv_config,
                )
            else:
                h = attention_prefill(
                    ops, h, layer.mixer, inp, pools.k[j], pools.v[j], self.rot, self.sdpa_config
                )
            x = ops.add(x, h)
            x = ops.add(x, self._mlp(ops.rms_norm(x, layer.post_norm, eps), layer))
        self._head(ops.matmul(inp.last_select, x), inp)  # the last valid token only

    def decode(self, inp: InputBuffers, pools: DevicePools) -> None:
        """One token for every pool row, i.e. state slot (idle slots are masked); pools updated in
        place."""
        ops, eps = self.ops, self.spec.rms_norm_eps
        x = ops.embedding(inp.ids, self.embed)  # [1, S, H]
        for layer in self.layers:
            h = ops.rms_norm(x, layer.input_norm, eps)
            j = layer.pool_index
            if isinstance(layer.mixer, GdnWeights):
                h = gdn_decode(
                    ops, h, layer.mixer, inp, pools.conv[j], pools.rec[j], self.gdn_rows_per_call
                )
            else:
                h = attention_decode(ops, h, layer.mixer, inp, pools.k[j], pools.v[j], self.rot)
            x = ops.add(x, h)
            x = ops.add(x, self._mlp(ops.rms_norm(x, layer.post_norm, eps), layer))
        self._head(x, inp)


def _channel_chunk(channels: int, target: int = 768) -> int:
    """Largest tile-aligned divisor of the conv channels not above ``target``."""
    best = 32
    for c in range(32, min(channels, target) + 1, 32):
        if channels % c == 0:
            best = c
    return best
