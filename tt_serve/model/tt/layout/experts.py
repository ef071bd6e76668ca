"""How MoE experts are laid out (numpy side): the two dispatch paths and the dense path's groups.

The device program of both paths is ``runtime/moe.py``.
"""

from __future__ import annotations

from typing import Literal

MoeDispatch = Literal["sparse", "dense"]
DISPATCHES: tuple[MoeDispatch, ...] = ("sparse", "dense")

# Rows (experts x intermediate) of one dense group's matmuls: bounds each expert activation to
# 64 KiB per token in bf16 (2 MiB at a 32-row decode, 16 MiB at a 256-token prefill chunk).
EXPERT_GROUP_ROWS = 32768


def expert_groups(num_experts: int, intermediate: int) -> list[tuple[int, int]]:
    """[first, end) expert ranges of the dense path's stacked-weight groups: as many whole
    experts as fit in EXPERT_GROUP_ROWS rows (at least one), the last group possibly smaller."""
    size = max(1, EXPERT_GROUP_ROWS // max(intermediate, 1))
    return [(a, min(num_experts, a + size)) for a in range(0, num_experts, size)]
