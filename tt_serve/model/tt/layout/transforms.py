"""The numpy transforms that turn canonical checkpoint tensors into device layouts.

Each is a pure function of numpy arrays; ``table.py`` names which one builds which device
weight. Shape-only arrays (planning a real-size model from its ``config.json``) stay shape-only
through every one of them, so planning allocates nothing.
"""

from __future__ import annotations

import numpy as np

from tt_serve.model.tt.layout.host import contiguous, is_shape_only, shape_only_array


def linear_t(w: np.ndarray) -> np.ndarray:
    """torch [out, in] -> ttnn [in, out]."""
    return contiguous(w.T)


def norm_weight(w: np.ndarray, *, plus_one: bool) -> np.ndarray:
    """[dim] -> [1, 1, dim/32, 32] ROW_MAJOR, the ttnn RMSNorm weight layout."""
    v = (1.0 + w) if plus_one else w
    return v.astype(np.float32).reshape(1, 1, -1, 32)


def split_q_gate(q_proj: np.ndarray, heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows come per head as [q | gate]; return (q [heads·hd, H], gate [heads·hd, H])."""
    per = q_proj.reshape(heads, 2 * head_dim, -1)
    h = q_proj.shape[-1]
    return per[:, :head_dim].reshape(-1, h), per[:, head_dim:].reshape(-1, h)


def conv_tap(conv: np.ndarray, j: int) -> np.ndarray:
    """conv [C, K] -> tap ``j`` [1, 1, 1, C]; tap 0 multiplies the oldest input."""
    return contiguous(conv[:, j]).reshape(1, 1, 1, -1)


def conv_taps(conv: np.ndarray) -> list[np.ndarray]:
    """conv [C, K] -> K taps [1, 1, 1, C], oldest first."""
    return [conv_tap(conv, j) for j in range(conv.shape[1])]


def head_vector(v: np.ndarray) -> np.ndarray:
    """A per-value-head vector [hv] as the fp32 [1, 1, hv] the gate math broadcasts."""
    return v.astype(np.float32).reshape(1, 1, -1)


def stacked_expert_part(
    gate_up: np.ndarray, down: np.ndarray, first: int, end: int, inter: int, part: str
) -> np.ndarray:
    """One operand (``part``: "gate", "up" or "down") of :func:`stacked_experts`, built alone
    so that a table entry per operand copies only its own experts."""
    g, h = end - first, gate_up.shape[-1]
    if is_shape_only(gate_up):
        return shape_only_array((1, 1, h, g * inter) if part == "down" else (1, g, inter, h))
    if part == "gate":
        return np.ascontiguousarray(gate_up[first:end, :inter])[None]
    if part == "up":
        return np.ascontiguousarray(gate_up[first:end, inter:])[None]
    return np.ascontiguousarray(down[first:end].transpose(1, 0, 2)).reshape(1, 1, h, g * inter)


def stacked_experts(
    gate_up: np.ndarray, down: np.ndarray, first: int, end: int, inter: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Experts [first, end) of the fused checkpoint tensors (gate_up [E, 2I, H], down [E, H, I])
    as the stacked operands of ``tt/runtime/moe.py``: gate and up [1, G, I, H] (the checkpoint's own
    [out, in] orientation: they are the matmul's A), down [1, 1, H, G·I] with expert g's [H, I]
    in column block g."""
    gate, up, cat = (
        stacked_expert_part(gate_up, down, first, end, inter, part)
        for part in ("gate", "up", "down")
    )
    return gate, up, cat


def sparse_gate_up(gate_up: np.ndarray) -> np.ndarray:
    """gate_up [E, 2I, H] -> sparse_matmul's B [1, E, H, 2I] (columns [0, I) gate, [I, 2I) up)."""
    e, two_i, h = gate_up.shape
    if is_shape_only(gate_up):
        return shape_only_array((1, e, h, two_i))
    return np.ascontiguousarray(gate_up.transpose(0, 2, 1))[None]


def sparse_down(down: np.ndarray) -> np.ndarray:
    """down [E, H, I] -> sparse_matmul's B [1, E, I, H]."""
    e, h, inter = down.shape
    if is_shape_only(down):
        return shape_only_array((1, e, inter, h))
    return np.ascontiguousarray(down.transpose(0, 2, 1))[None]


def sparse_experts(gate_up: np.ndarray, down: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fused checkpoint tensors (gate_up [E, 2I, H], down [E, H, I]) as sparse_matmul's B
    operands ([in, out] per expert): gate_up [1, E, H, 2I] (columns [0, I) gate, [I, 2I) up) and
    down [1, E, I, H]; on a mesh both split on the expert dim (whole experts per chip)."""
    return sparse_gate_up(gate_up), sparse_down(down)
