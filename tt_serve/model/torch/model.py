"""The hybrid Qwen3.5 / Qwen3-Next decoder stack over canonical weights (see model/weights.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypedDict

import torch
import torch.nn.functional as F

from tt_serve.model.blockfloat import BLOCK_FLOATS
from tt_serve.model.formats import round_to
from tt_serve.model.ref.attention import AttentionWeights, attention_forward
from tt_serve.model.ref.gdn import GdnWeights, gdn_forward
from tt_serve.model.ref.layers import (
    Linear,
    add_rms_norm,
    fused,
    norm_scale,
    packs,
    rms_norm,
    rope_cos_sin,
    rope_inv_freq,
    swiglu,
)
from tt_serve.model.ref.moe import MoeWeights, moe_forward
from tt_serve.model.ref.plan import StepPlan, as_index
from tt_serve.model.spec import FULL_ATTENTION, ModelSpec
from tt_serve.model.torch.pools import Pools
from tt_serve.model.torch.screen import ScreenedHead
from tt_serve.model.torch.screen import available as screen_available


class GdnMixer(Protocol):
    """A GDN token mixer: normed h [T, H] of layer rank j -> [T, H], or [len(keep), H] of the
    tokens at batch offsets ``keep`` (the mixer still reads and writes every token's state)."""

    def __call__(
        self, h: torch.Tensor, w: GdnWeights, j: int, keep: Sequence[int] | None = None
    ) -> torch.Tensor: ...


class AttentionMixer(Protocol):
    """A full-attention token mixer; ``keep`` as for ``GdnMixer`` (every token's K/V is
    written, only the kept tokens' queries attend)."""

    def __call__(
        self, h: torch.Tensor, w: AttentionWeights, j: int, keep: Sequence[int] | None = None
    ) -> torch.Tensor: ...


class LinearOptions(TypedDict, total=False):
    storage: str
    bf16_inputs: bool


@dataclass(frozen=True)
class CardStorage:
    """What a Tenstorrent card stores each checkpoint tensor as under a precision profile
    (``dtypes``: ``tt/layout/table.checkpoint_dtypes``, the table the ttnn layout is built
    from), applied to the torch backend's tensors. Projections and the LM head keep the card's
    block-float (or bf16) values in a ``Linear`` fed bf16 activations, as the card's matmuls
    are; the embedding, norm scales (``1 + w`` for Qwen's RMSNorm, as the card stores it), conv
    taps and MoE router are rounded to the card's bf16 and kept in fp32. MoE routed experts
    stay in the checkpoint's precision here (not yet packed). ``dtypes`` None: every tensor as
    the checkpoint has it (the fp32 reference)."""

    dtypes: dict[str, str] | None = None

    def linear_options(self, key: str) -> LinearOptions:
        if self.dtypes is None:
            return {}
        return {"storage": self.dtypes.get(key, "float32"), "bf16_inputs": True}

    def values(self, t: torch.Tensor, key: str) -> torch.Tensor:
        """``t`` (checkpoint tensor ``key``, or its norm scale) with the card's values."""
        dtype = "float32" if self.dtypes is None else self.dtypes.get(key, "float32")
        if dtype == "float32":
            return t
        if dtype in BLOCK_FLOATS:
            raise ValueError(f"{key} is a block float on the card: it belongs in a Linear")
        return round_to(t, dtype).to(t.dtype)


@dataclass(frozen=True)
class DenseMlpWeights:
    gate_up: Linear  # [gate | up] x H fused
    down: Linear


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor  # norm_scale(w): fp32 1 + w
    post_norm: torch.Tensor
    mixer: GdnWeights | AttentionWeights
    mlp: DenseMlpWeights | MoeWeights
    pool_index: int  # rank of this layer among layers of its kind (indexes Pools lists)


class HybridModel:
    """Stateless forward over a StepPlan; all sequence state lives in ``Pools``."""

    def __init__(
        self,
        spec: ModelSpec,
        weights: dict[str, torch.Tensor],
        device: torch.device,
        *,
        screen: bool = True,
        dtypes: dict[str, str] | None = None,
    ) -> None:
        self.spec = spec
        w = {n: t.to(device) for n, t in weights.items()}
        card = CardStorage(dtypes)
        self.card = card
        self.embed = card.values(w["embed_tokens.weight"], "embed_tokens.weight")
        self.final_norm = card.values(norm_scale(w["norm.weight"]), "norm.weight")
        self.lm_head = LmHead(
            w["lm_head.weight"], screen=screen, **card.linear_options("lm_head.weight")
        )
        self.inv_freq = rope_inv_freq(spec.rotary_dim, spec.rope_theta, device)
        self.layers = [self._layer(spec, w, i, card) for i in range(spec.num_layers)]

    @staticmethod
    def _layer(
        spec: ModelSpec, w: dict[str, torch.Tensor], i: int, card: CardStorage
    ) -> LayerWeights:
        p = f"layers.{i}."

        def lin(key: str) -> Linear:
            return Linear(w[key], **card.linear_options(key))

        def fuse(*keys: str) -> tuple[Linear, tuple[int, ...]]:
            options = {str(card.linear_options(k)) for k in keys}
            if len(options) != 1:
                raise ValueError(f"fused projections {keys} are stored in different formats")
            return fused(*(w[k] for k in keys), **card.linear_options(keys[0]))

        def norm(key: str) -> torch.Tensor:
            return card.values(norm_scale(w[key]), key)

        mixer: GdnWeights | AttentionWeights
        if spec.layer_types[i] == FULL_ATTENTION:
            a = p + "self_attn."
            qkv, qkv_splits = fuse(*(a + f"{n}_proj.weight" for n in "qkv"))
            mixer = AttentionWeights(
                qkv_proj=qkv,
                qkv_splits=qkv_splits,
                o_proj=lin(a + "o_proj.weight"),
                q_norm=norm(a + "q_norm.weight"),
                k_norm=norm(a + "k_norm.weight"),
                num_heads=spec.num_attention_heads,
                num_kv_heads=spec.num_kv_heads,
                head_dim=spec.head_dim,
                eps=spec.rms_norm_eps,
            )
            rank = spec.attention_layers.index(i)
        else:
            g = p + "linear_attn."
            in_proj, in_splits = fuse(*(g + f"in_proj_{n}.weight" for n in ("qkv", "z", "b", "a")))
            conv = card.values(w[g + "conv1d.weight"].float(), g + "conv1d.weight")
            mixer = GdnWeights(
                in_proj=in_proj,
                in_splits=in_splits,
                # tap-major storage: causal_conv reads one tap (a [C] column) at a time
                conv=conv.T.contiguous().T,
                neg_a=-w[g + "A_log"].float().exp(),
                dt_bias=w[g + "dt_bias"].float(),
                norm=card.values(w[g + "norm.weight"], g + "norm.weight"),
                out_proj=lin(g + "out_proj.weight"),
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
                router=card.values(w[m + "gate.weight"], m + "gate.weight"),
                gate_up=w[m + "experts.gate_up_proj"],
                down=w[m + "experts.down_proj"],
                shared_gate_up=fuse(
                    m + "shared_expert.gate_proj.weight", m + "shared_expert.up_proj.weight"
                )[0],
                shared_down=lin(m + "shared_expert.down_proj.weight"),
                shared_expert_gate=card.values(
                    w[m + "shared_expert_gate.weight"], m + "shared_expert_gate.weight"
                ),
                top_k=spec.num_experts_per_tok,
                norm_topk_prob=spec.norm_topk_prob,
            )
        else:
            gate_up, _ = fuse(m + "gate_proj.weight", m + "up_proj.weight")
            mlp = DenseMlpWeights(gate_up, lin(m + "down_proj.weight"))
        return LayerWeights(
            norm(p + "input_layernorm.weight"),
            norm(p + "post_attention_layernorm.weight"),
            mixer,
            mlp,
            rank,
        )

    def hidden_states(
        self, plan: StepPlan, pools: Pools, keep: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Final-normed hidden states [T, H] of every token in the step, or [len(keep), H] of
        the tokens at batch offsets ``keep`` (ascending): see ``run_layers``."""
        x = F.embedding(plan.token_ids, self.embed)
        cos, sin = rope_cos_sin(plan.positions, self.inv_freq, x.dtype)

        def gdn(
            h: torch.Tensor, w: GdnWeights, j: int, keep: Sequence[int] | None = None
        ) -> torch.Tensor:
            return gdn_forward(h, w, plan, pools.conv[j], pools.rec[j], keep)

        def attn(
            h: torch.Tensor, w: AttentionWeights, j: int, keep: Sequence[int] | None = None
        ) -> torch.Tensor:
            return attention_forward(h, w, plan, cos, sin, pools.k[j], pools.v[j], keep)

        return self.run_layers(x, gdn, attn, keep)

    def run_layers(
        self,
        x: torch.Tensor,
        gdn: GdnMixer,
        attn: AttentionMixer,
        keep: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """The decoder stack over embedded tokens x [T, H] with the given token mixers (the
        eager plan-driven ones, or the static masked ones of the graph path); final-normed.

        With ``keep`` (batch offsets, ascending) only those tokens leave the stack: the last
        layer's mixer still takes every token (its K/V or recurrent state is what the next step
        reads) but computes the output of the kept ones, and its MLP and the final norm run on
        those rows alone. A prefill chunk whose logits are not read keeps none of its tokens:
        its last-layer attention (the quadratic part on a model whose last layer attends, as
        Qwen3.5's and Qwen3-Next's do) reduces to the K/V write."""
        eps = self.spec.rms_norm_eps
        final = len(self.layers) - 1
        h = rms_norm(x, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            cut = keep if i == final else None
            if isinstance(layer.mixer, GdnWeights):
                h = gdn(h, layer.mixer, layer.pool_index, cut)
            else:
                h = attn(h, layer.mixer, layer.pool_index, cut)
            if cut is not None:
                x = x[as_index(cut, x.device)]
            x, h = add_rms_norm(x, h, layer.post_norm, eps)
            if isinstance(layer.mlp, MoeWeights):
                h = moe_forward(h, layer.mlp)
            else:
                h = swiglu(h, layer.mlp.gate_up, layer.mlp.down)
            # the residual add, then the next layer's input norm (or the final norm)
            nxt = self.final_norm if i == final else self.layers[i + 1].input_norm
            x, h = add_rms_norm(x, h, nxt, eps)
        return h

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> fp32 logits [N, vocab]."""
        return self.lm_head(hidden)


class LmHead:
    """The [vocab, H] projection a decode step multiplies a few rows by, at the kernel that is
    fastest for few rows on the device.

    On the CPU it is a packed ``Linear`` (the weight reordered once into oneDNN's blocked
    layout): a GEMM on it neither repacks the 254 MB weight per call nor falls into the small-M
    cliff of the plain kernels (2 cores, 248,320 x 256 fp32: 6.9 ms at 1 row, about 1.5x faster
    than ``h @ W.T`` on a contiguous [H, vocab] copy, 2x and more at 8 to 32 rows:
    ``python -m bench.kernels.lm_head_layout``, bench/runs/lm-head-layout.jsonl). Elsewhere
    (CUDA) the weight is kept [H, vocab] contiguous. fp32 stays fp32: only the summation order differs
    (<= 1e-4 on the logits). A tied model keeps the embedding too (one more [vocab, H] copy).

    ``screened`` (fp32, or bf16 where the CPU multiplies bf16 natively, on a CPU with an exact
    int8 GEMM, unless ``screen=False``): the int8 screen of ``torch/screen.py`` that greedy and
    top-k rows are picked through, the same tokens at about a third of the read (a half in
    bf16). It keeps the plain weight (the embedding itself when tied: no
    copy; one more fp32 copy when not) and an int8 one (a quarter of its size)."""

    def __init__(
        self,
        weight: torch.Tensor,
        *,
        screen: bool = True,
        storage: str = "float32",
        bf16_inputs: bool = False,
    ) -> None:
        self.packed: Linear | None = None
        self.weight_t: torch.Tensor | None = None
        self.screened: ScreenedHead | None = None
        if storage != "float32":  # the card's values: every logit from them, no screen
            self.packed = Linear(weight, storage, bf16_inputs=bf16_inputs)
            return
        if screen and packs(weight) and screen_available():  # fp32, or bf16 on a bf16 CPU
            self.screened = ScreenedHead(weight)
        if packs(weight):
            self.packed = Linear(weight)
        else:
            self.weight_t = weight.t().contiguous()

    @property
    def nbytes_per_token(self) -> int:
        """Bytes a greedy decode row reads of the head: the int8 screen (its few exact rows
        left out) or the whole held weight."""
        if self.screened is not None:
            return self.screened.weight.numel()
        if self.packed is not None:
            return self.packed.nbytes
        assert self.weight_t is not None
        return self.weight_t.numel() * self.weight_t.element_size()

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return self.packed(hidden).float()
        assert self.weight_t is not None
        return (hidden @ self.weight_t).float()
