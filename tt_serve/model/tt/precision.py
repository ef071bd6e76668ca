"""Precision of the ttnn backend: one small frozen config, no branches in the layers.

Weights of each group are converted once to ``bfloat16`` or ``bfloat8_b`` (block float, TILE
only). Norm weights, GDN gate constants and the recurrent state stay in higher precision: the
Qwen3.5 port in tt-metal reports the DeltaNet state blowing up when it is kept in low precision.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

WEIGHT_DTYPES = ("bfloat16", "bfloat8_b")


@dataclass(frozen=True)
class Precision:
    attention: str = "bfloat16"
    gdn: str = "bfloat16"
    mlp: str = "bfloat8_b"
    experts: str = "bfloat8_b"
    lm_head: str = "bfloat16"
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
        """``bfloat16``: every weight bf16. ``mixed``: MLP and expert weights bfloat8_b, the
        rest bf16 (``ServeConfig.resolved_precision`` names the profile)."""
        if name == "bfloat16":
            return Precision(mlp="bfloat16", experts="bfloat16")
        if name == "mixed":
            return Precision()
        raise ValueError(f"unknown ttnn precision {name!r}; choose bfloat16 or mixed")

    def key(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(asdict(self).items()))
