"""What a batch-1 decode step of the torch CPU backend reads of its weights, per precision
profile, from the spec alone (no weights: ``tt-serve plan --backend torch`` on a published size).

It counts what ``HybridModel`` holds: every projection ``Linear`` as held (fp32 for float32 and
bfloat16, whose card values are kept in fp32; a block float packed as the card holds it, each
fused part padded to 16 outputs: 1 or 1/2 byte a code and one exponent byte per 16), the MoE
layers' shared expert and their ``top_k`` routed experts (fp32: not packed yet), and the LM
head's read: the int8 screen in float32 (vocab x hidden bytes, an upper bound: its few exact
rows are left out), the packed or held weight in a profile. Norms, conv taps and the router are
left out (a few MB). tests/model/test_footprint.py holds it to the built model's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tt_serve.model.blockfloat import BLOCK_FLOATS
from tt_serve.model.formats import BLOCK, MANTISSA_BITS
from tt_serve.model.precision import Precision
from tt_serve.model.ref.layers import Linear
from tt_serve.model.spec import FULL_ATTENTION, ModelSpec
from tt_serve.model.tt.layout.table import checkpoint_dtypes

if TYPE_CHECKING:
    from tt_serve.model.torch.model import HybridModel

# Bytes a weight of each storage takes in a ``Linear``: fp32 for float32 and bfloat16; a block
# float's code (sign + mantissa bits) plus its share of the exponent byte of its block.
BYTES = {"float32": 4.0, "bfloat16": 4.0} | {
    dtype: (1 + bits) / 8 + 1 / BLOCK for dtype, bits in MANTISSA_BITS.items()
}


@dataclass(frozen=True)
class DecodeRead:
    """Weight bytes one batch-1 decode step reads: the layers' projections and the LM head."""

    projections: int
    lm_head: int

    @property
    def total(self) -> int:
        return self.projections + self.lm_head


def _linear(parts: list[tuple[int, int]], storage: str) -> int:
    """Bytes of one ``Linear`` over the fused [out_i, in] parts in ``storage``."""
    pad = BLOCK if storage in BLOCK_FLOATS else 1
    return round(sum(-(-o // pad) * pad * i for o, i in parts) * BYTES[storage])


def decode_read(spec: ModelSpec, profile: str | None = None) -> DecodeRead:
    """The bytes for ``profile`` (None: float32, the checkpoint's own values)."""
    dtypes = {} if profile is None else checkpoint_dtypes(spec, Precision.named(profile))
    s, h = spec, spec.hidden_size

    def lin(key: str, *parts: tuple[int, int]) -> int:
        return _linear(list(parts), dtypes.get(key, "float32"))

    total = 0
    for i, kind in enumerate(s.layer_types):
        p = f"layers.{i}."
        if kind == FULL_ATTENTION:
            a, kv, d = s.num_attention_heads, s.num_kv_heads, s.head_dim
            total += lin(p + "self_attn.q_proj.weight", (2 * a * d, h), (kv * d, h), (kv * d, h))
            total += lin(p + "self_attn.o_proj.weight", (h, a * d))
        else:
            g, hv = p + "linear_attn.", s.linear_num_value_heads
            parts = [(s.conv_dim, h), (s.gdn_value_dim, h), (hv, h), (hv, h)]
            total += lin(g + "in_proj_qkv.weight", *parts)
            total += lin(g + "out_proj.weight", (h, s.gdn_value_dim))
        m = p + "mlp."
        if s.is_moe_layer(i):
            sh = s.shared_expert_intermediate_size
            total += lin(m + "shared_expert.gate_proj.weight", (sh, h), (sh, h))
            total += lin(m + "shared_expert.down_proj.weight", (h, sh))
            total += s.num_experts_per_tok * 3 * s.moe_intermediate_size * h * 4
        else:
            total += lin(m + "gate_proj.weight", (s.intermediate_size, h), (s.intermediate_size, h))
            total += lin(m + "down_proj.weight", (h, s.intermediate_size))
    head = dtypes.get("lm_head.weight", "float32")
    # float32: the int8 screen
    screen = s.vocab_size * h
    return DecodeRead(total, screen if head == "float32" else _linear([(s.vocab_size, h)], head))


def linears(obj: object) -> list[Linear]:
    """Every ``Linear`` a layer's weights hold (dataclass fields, one level of nesting)."""
    out: list[Linear] = []
    for value in vars(obj).values():
        if isinstance(value, Linear):
            out.append(value)
        elif hasattr(value, "__dataclass_fields__"):
            out += linears(value)
    return out


def held_read(model: HybridModel) -> DecodeRead:
    """The same bytes read off a built model: its projections as held, its head's read (the
    routed experts of a MoE layer are not ``Linear``s: use ``decode_read`` there)."""
    per_layer = sum(lin.nbytes for layer in model.layers for lin in linears(layer))
    return DecodeRead(per_layer, model.lm_head.nbytes_per_token)
