"""Precision of the ttnn backend: one small frozen config, no branches in the layers.

Weights of each group are converted once to ``bfloat16``, ``bfloat8_b`` or ``bfloat4_b`` (block
floats, TILE only) and every matmul on them runs with an explicit compute kernel config whose
math fidelity matches the weight dtype (:data:`FIDELITY`, the tt_transformers recipe: bf16 ->
HiFi4, bfp8 -> HiFi2, bfp4 -> LoFi). The routed experts are ``ttnn.sparse_matmul``'s B operand,
which takes all three (0.81.1: BFLOAT4_B, BFLOAT8_B, BFLOAT16, FLOAT32; ``virtual/rules_moe.py`` ``sparse_matmul``),
with bf16 activations as A and a bf16 output. Norm weights, GDN gate constants and the recurrent
state stay in higher precision: the Qwen3.5 port in tt-metal reports the DeltaNet state blowing up
when it is kept in low precision.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

WEIGHT_DTYPES = ("bfloat16", "bfloat8_b", "bfloat4_b")
# weight dtype -> (math fidelity, fp32 accumulation in dest)
FIDELITY: dict[str, tuple[str, bool]] = {
    "bfloat16": ("HiFi4", True),
    "bfloat8_b": ("HiFi2", True),
    "bfloat4_b": ("LoFi", False),
}
PROFILES = ("bfloat16", "mixed", "bfp4-mlp")


@dataclass(frozen=True)
class Precision:
    """Defaults: the ``mixed`` profile."""

    attention: str = "bfloat8_b"
    gdn: str = "bfloat8_b"
    mlp: str = "bfloat8_b"
    experts: str = "bfloat8_b"
    lm_head: str = "bfloat8_b"
    activations: str = "bfloat16"
    kv_cache: str = "bfloat16"
    conv_state: str = "bfloat16"
    recurrent_state: str = "float32"

    def __post_init__(self) -> None:
        for name in ("attention", "gdn", "mlp", "experts", "lm_head"):
            value = getattr(self, name)
            if value not in WEIGHT_DTYPES:
                raise ValueError(f"precision.{name}={value!r}; choose one of {WEIGHT_DTYPES}")
        if self.recurrent_state != "float32":
            raise ValueError("the GDN recurrent state must stay float32")

    @staticmethod
    def named(name: str) -> Precision:
        """``bfloat16``: every weight bf16. ``mixed``: attention, GDN, MLP, expert and LM-head
        weights bfloat8_b. ``bfp4-mlp``: as ``mixed`` with MLP and expert weights bfloat4_b
        (``ServeConfig.resolved_precision`` names the profile)."""
        if name == "bfloat16":
            bf16 = "bfloat16"
            return Precision(attention=bf16, gdn=bf16, mlp=bf16, experts=bf16, lm_head=bf16)
        if name == "mixed":
            return Precision()
        if name == "bfp4-mlp":
            return Precision(mlp="bfloat4_b", experts="bfloat4_b")
        raise ValueError(f"unknown ttnn precision {name!r}; choose one of {', '.join(PROFILES)}")

    def key(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(asdict(self).items()))
