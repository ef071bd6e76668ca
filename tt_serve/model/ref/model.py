"""The hybrid Qwen3.5 / Qwen3-Next decoder stack over canonical weights (see model/weights.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.mkldnn

from tt_serve.model.ref.attention import AttentionWeights, attention_forward
from tt_serve.model.ref.gdn import GdnWeights, gdn_forward
from tt_serve.model.ref.layers import rms_norm, rope_cos_sin, rope_inv_freq, swiglu
from tt_serve.model.ref.moe import MoeWeights, moe_forward
from tt_serve.model.ref.plan import StepPlan
from tt_serve.model.ref.pools import Pools
from tt_serve.model.spec import FULL_ATTENTION, ModelSpec

GdnMixer = Callable[[torch.Tensor, GdnWeights, int], torch.Tensor]
AttentionMixer = Callable[[torch.Tensor, AttentionWeights, int], torch.Tensor]


@dataclass(frozen=True)
class DenseMlpWeights:
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    mixer: GdnWeights | AttentionWeights
    mlp: DenseMlpWeights | MoeWeights
    pool_index: int  # rank of this layer among layers of its kind (indexes Pools lists)


class HybridModel:
    """Stateless forward over a StepPlan; all sequence state lives in ``Pools``."""

    def __init__(
        self, spec: ModelSpec, weights: dict[str, torch.Tensor], device: torch.device
    ) -> None:
        self.spec = spec
        w = {n: t.to(device) for n, t in weights.items()}
        self.embed = w["embed_tokens.weight"]
        self.final_norm = w["norm.weight"]
        self.lm_head = LmHead(w["lm_head.weight"])
        self.inv_freq = rope_inv_freq(spec.rotary_dim, spec.rope_theta, device)
        self.layers = [self._layer(spec, w, i) for i in range(spec.num_layers)]

    @staticmethod
    def _layer(spec: ModelSpec, w: dict[str, torch.Tensor], i: int) -> LayerWeights:
        p = f"layers.{i}."
        mixer: GdnWeights | AttentionWeights
        if spec.layer_types[i] == FULL_ATTENTION:
            a = p + "self_attn."
            mixer = AttentionWeights(
                q_proj=w[a + "q_proj.weight"],
                k_proj=w[a + "k_proj.weight"],
                v_proj=w[a + "v_proj.weight"],
                o_proj=w[a + "o_proj.weight"],
                q_norm=w[a + "q_norm.weight"],
                k_norm=w[a + "k_norm.weight"],
                num_heads=spec.num_attention_heads,
                num_kv_heads=spec.num_kv_heads,
                head_dim=spec.head_dim,
                eps=spec.rms_norm_eps,
            )
            rank = spec.attention_layers.index(i)
        else:
            g = p + "linear_attn."
            mixer = GdnWeights(
                in_proj_qkv=w[g + "in_proj_qkv.weight"],
                in_proj_z=w[g + "in_proj_z.weight"],
                in_proj_b=w[g + "in_proj_b.weight"],
                in_proj_a=w[g + "in_proj_a.weight"],
                conv=w[g + "conv1d.weight"].float(),
                a_log=w[g + "A_log"].float(),
                dt_bias=w[g + "dt_bias"].float(),
                norm=w[g + "norm.weight"],
                out_proj=w[g + "out_proj.weight"],
                num_k_heads=spec.linear_num_key_heads,
                num_v_heads=spec.linear_num_value_heads,
                head_k_dim=spec.linear_key_head_dim,
                head_v_dim=spec.linear_value_head_dim,
                eps=spec.rms_norm_eps,
            )
            rank = spec.gdn_layers.index(i)
        m = p + "mlp."
        mlp: DenseMlpWeights | MoeWeights
        if spec.is_moe_layer(i):
            mlp = MoeWeights(
                router=w[m + "gate.weight"],
                gate_up=w[m + "experts.gate_up_proj"],
                down=w[m + "experts.down_proj"],
                shared_gate=w[m + "shared_expert.gate_proj.weight"],
                shared_up=w[m + "shared_expert.up_proj.weight"],
                shared_down=w[m + "shared_expert.down_proj.weight"],
                shared_expert_gate=w[m + "shared_expert_gate.weight"],
                top_k=spec.num_experts_per_tok,
                norm_topk_prob=spec.norm_topk_prob,
            )
        else:
            mlp = DenseMlpWeights(
                w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"]
            )
        return LayerWeights(
            w[p + "input_layernorm.weight"],
            w[p + "post_attention_layernorm.weight"],
            mixer,
            mlp,
            rank,
        )

    def hidden_states(self, plan: StepPlan, pools: Pools) -> torch.Tensor:
        """Final-normed hidden states [T, H] of every token in the step."""
        x = F.embedding(plan.token_ids, self.embed)
        cos, sin = rope_cos_sin(plan.positions, self.inv_freq, x.dtype)

        def gdn(h: torch.Tensor, w: GdnWeights, j: int) -> torch.Tensor:
            return gdn_forward(h, w, plan, pools.conv[j], pools.rec[j])

        def attn(h: torch.Tensor, w: AttentionWeights, j: int) -> torch.Tensor:
            return attention_forward(h, w, plan, cos, sin, pools.k[j], pools.v[j])

        return self.run_layers(x, gdn, attn)

    def run_layers(self, x: torch.Tensor, gdn: GdnMixer, attn: AttentionMixer) -> torch.Tensor:
        """The decoder stack over embedded tokens x [T, H] with the given token mixers (the
        eager plan-driven ones, or the static masked ones of the graph path); final-normed."""
        eps = self.spec.rms_norm_eps
        for layer in self.layers:
            h = rms_norm(x, layer.input_norm, eps)
            if isinstance(layer.mixer, GdnWeights):
                h = gdn(h, layer.mixer, layer.pool_index)
            else:
                h = attn(h, layer.mixer, layer.pool_index)
            x = x + h
            h = rms_norm(x, layer.post_norm, eps)
            if isinstance(layer.mlp, MoeWeights):
                h = moe_forward(h, layer.mlp)
            else:
                h = swiglu(h, layer.mlp.gate, layer.mlp.up, layer.mlp.down)
            x = x + h
        return rms_norm(x, self.final_norm, eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> fp32 logits [N, vocab]."""
        return self.lm_head(hidden)


class LmHead:
    """The [vocab, H] projection a decode step multiplies a few rows by, at the kernel that is
    fastest for few rows on the device.

    On the CPU the weight is reordered once into oneDNN's blocked layout (``MkldnnLinear``): a
    GEMM on it then neither repacks the 254 MB weight per call nor falls into the small-M cliff
    of the plain kernels (2 cores, 248,320 x 256 fp32: about 1.2x faster than ``h @ W.T`` on a
    contiguous [H, vocab] copy at 1 row, 1.7-2.2x at 2 to 16 rows, even at 32:
    ``python -m bench.lm_head_layout``, bench/runs/lm-head-layout.jsonl). Elsewhere (CUDA) the
    weight is kept [H, vocab] contiguous. fp32 stays fp32: only the summation order differs
    (<= 1e-6 on the logits). A tied model keeps the embedding too (one more [vocab, H] copy)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.packed: torch.nn.Module | None = None
        if weight.device.type == "cpu" and torch.backends.mkldnn.is_available():
            linear = torch.nn.Linear(
                weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype
            )
            linear.weight = torch.nn.Parameter(weight, requires_grad=False)
            self.packed = torch.utils.mkldnn.to_mkldnn(linear, weight.dtype)
            self.weight_t = None
        else:
            self.weight_t = weight.t().contiguous()

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return self.packed(hidden.contiguous().to_mkldnn()).to_dense().float()
        assert self.weight_t is not None
        return (hidden @ self.weight_t).float()
