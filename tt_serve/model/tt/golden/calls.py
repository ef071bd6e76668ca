"""Each op the runtime issues, called through ttnn's golden function: which golden (``GOLDENS``,
by the virtual device's op name), and how the virtual call's arguments become the golden's and
its result becomes what the virtual op writes (same shapes, fp32 or int64 values).

An adapter gets ``ttnn`` and the virtual call's bound arguments (``p``, tensors already torch:
their logical values) and returns the op's outputs in the virtual op's order and layout. Where
the two sides state a convention differently, it was settled against tt-metal's source and is
pinned in ``tests/tt/golden/``:

* output formats: every golden is asked for fp32 results (``dtype`` / ``typecast`` targets that
  are floats become ``ttnn.float32``). Rounding to a declared format is ``formats.py``'s check
  and the virtual device's formats mode's, not the math's.
* ``chunk_gated_delta_rule``: the op refuses ``use_qk_l2norm`` ("pre-normalize q/k on host");
  rank-4 q/k must come normalised and are scaled on the host, while the flat rank-3 form (the
  runtime's) takes them raw and its prep kernel L2-normalises them over K and folds in
  ``scale``, with K == V and value head hv reading key head hv / (HV / H)
  (tt-metal:ttnn/cpp/ttnn/operations/transformer/chunk_gated_delta_rule/chunk_gated_delta_rule.cpp).
  The golden handles rank 4 only, so for rank 3 the adapter splits the heads (K = V) and asks
  for ``use_qk_l2norm=True``, which models what that kernel does. Our virtual math normalised
  in both forms: wrong for rank 4, fixed in ``virtual/gdn.py``.
* ``fused_recurrent_gated_delta_rule``: q/k normalised on the host (the op's docstring:
  ``use_qk_l2norm`` must be False), g in log space, beta after the sigmoid, arguments in the
  op's order (q, k, v, g, beta); the golden passes them to its FLA-ordered recurrence as
  (q, k, v, beta, g). GQA maps value head hv to key head hv / (HV / H) on both sides.
* ``paged_scaled_dot_product_attention_decode``: the 0.81.1 docstring gives the output as
  ``[1, b, pnh, dh]`` (heads padded to a tile), which the virtual device models; the golden, like
  ``compute_output_specs`` in
  tt-metal:ttnn/cpp/ttnn/operations/transformer/sdpa_decode/device/sdpa_decode_device_operation.cpp,
  gives the logical ``nh`` heads. The runtime slices the real heads either way
  (``runtime/attention.py``); the adapter pads the golden with zero rows.
* the experimental CCLs (``all_gather_async``, ``reduce_scatter_minimal_async``) have no golden
  in 0.81.1; their results are the plain ``ttnn.all_gather`` / ``ttnn.reduce_scatter``'s, whose
  goldens run on the line's shards (``mesh_golden``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Adapter = Callable[[Any, Callable[..., Any], dict[str, Any]], Any]

# Ops with no golden function in ttnn 0.81.1 (``ttnn.get_golden_function`` raises): listed in
# the table, computed by the virtual device's own math in every mode.
NO_GOLDEN = {
    "paged_fill_cache": "experimental.paged_fill_cache",
    "paged_update_cache": "experimental.paged_update_cache",
    "nlp_create_qkv_heads": "experimental.nlp_create_qkv_heads",
    "qkv_causal_conv1d_silu": "experimental.kda.qkv_causal_conv1d_silu",
}


def _float(ttnn: Any, dtype: Any) -> Any:
    """A virtual dtype as the golden gets it: integer types as themselves, floats as fp32."""
    if dtype is None:
        return None
    name = getattr(dtype, "value", str(dtype))
    return getattr(ttnn, name) if name in ("uint32", "uint16", "int32") else ttnn.float32


def _values(x: Any) -> torch.Tensor:
    return x.float() if x.is_floating_point() or x.dtype == torch.bool else x.to(torch.int64)


def _binary(ttnn: Any, g: Callable[..., Any], p: dict[str, Any]) -> Any:
    return _values(g(p["a"], p["b"]))


def _unary(ttnn: Any, g: Callable[..., Any], p: dict[str, Any]) -> Any:
    return g(p["x"])


def _chunk_gdr(ttnn: Any, g: Callable[..., Any], p: dict[str, Any]) -> Any:
    q, k, v, state = p["q"], p["k"], p["v"], p["initial_state"]
    flat = q.dim() == 3
    if flat:  # the kernel's K == V; heads from the widths
        dv = state.shape[-1]
        q, k, v = (t.reshape(*t.shape[:2], -1, dv) for t in (q, k, v))
    o, final = g(
        q,
        k,
        v,
        p["g"],
        p["beta"],
        scale=p["scale"],
        initial_state=state,
        output_final_state=True,
        chunk_size=p["chunk_size"],
        use_qk_l2norm=flat,
    )
    return o, final


def _recurrent_gdr(ttnn: Any, g: Callable[..., Any], p: dict[str, Any]) -> Any:
    return g(
        p["q"],
        p["k"],
        p["v"],
        p["g"],
        p["beta"],
        scale=p["scale"],
        initial_state=p["initial_state"],
        output_final_state=True,
    )


def _chunked_sdpa(ttnn: Any, g: Callable[..., Any], p: dict[str, Any]) -> Any:
    return g(
        p["q"],
        p["k"],
        p["v"],
        p["page_table"],
        p["chunk_start_idx"],
        chunk_start_idx_tensor=p["chunk_start_idx_tensor"],
        scale=p["scale"],
    )


def _sdpa_decode(ttnn: Any, g: Callable[..., Any], p: dict[str, Any]) -> Any:
    q = p["q"]
    out = g(
        q, p["k"], p["v"], p["page_table"], cur_pos_tensor=p["cur_pos_tensor"], scale=p["scale"]
    )
    padded = -(-q.shape[2] // 32) * 32
    return torch.nn.functional.pad(out, (0, 0, 0, padded - out.shape[2]))


def _topk(ttnn: Any, g: Callable[..., Any], p: dict[str, Any]) -> Any:
    values, idx = g(
        p["x"],
        p["k"],
        p["dim"],
        p["largest"],
        p["sorted"],
        stable=p["stable"],
        indices_tensor=p["indices_tensor"],
    )
    return values, idx.to(torch.int64)


def _sparse_matmul(ttnn: Any, g: Callable[..., Any], p: dict[str, Any]) -> Any:
    return g(
        p["input_tensor_a"],
        p["input_tensor_b"],
        sparsity=p["sparsity"],
        nnz=p["nnz"],
        is_input_a_sparse=p["is_input_a_sparse"],
        is_input_b_sparse=p["is_input_b_sparse"],
    )


def _where(ttnn: Any, g: Callable[..., Any], p: dict[str, Any]) -> Any:
    def val(v: Any) -> Any:
        return v if isinstance(v, torch.Tensor) else float(v)

    return g(p["predicate"], val(p["true_value"]), val(p["false_value"]))


# op name (``DeviceBase._op``) -> (the ttnn attribute whose golden it is, the adapter)
GOLDENS: dict[str, tuple[str, Adapter]] = {
    "matmul": ("matmul", lambda t, g, p: g(p["a"], p["b"])),
    "embedding": ("embedding", lambda t, g, p: g(p["ids"], p["weight"])),
    "rms_norm": ("rms_norm", lambda t, g, p: g(p["x"], p["weight"], epsilon=p["epsilon"])),
    **{op: (op, _binary) for op in ("add", "sub", "mul", "ge", "gt", "le", "lt", "eq")},
    **{op: (op, _unary) for op in ("sigmoid", "silu", "exp", "log", "rsqrt", "reciprocal")},
    "softplus": (
        "softplus",
        lambda t, g, p: g(p["x"], beta=p["beta"], threshold=p["threshold"]),
    ),
    "sum": ("sum", lambda t, g, p: g(p["x"], p["dim"], p["keepdim"])),
    "softmax": ("softmax", lambda t, g, p: g(p["x"], p["dim"])),
    "topk": ("topk", _topk),
    "argmax": ("argmax", lambda t, g, p: g(p["x"], p["dim"]).to(torch.int64)),
    "where": ("where", _where),
    "reshape": ("reshape", lambda t, g, p: g(p["x"], tuple(p["shape"]))),
    "permute": ("permute", lambda t, g, p: g(p["x"], tuple(p["dims"]))),
    "slice": ("slice", lambda t, g, p: g(p["x"], list(p["start"]), list(p["end"]))),
    "concat": ("concat", lambda t, g, p: g(list(p["xs"]), p["dim"])),
    "to_layout": ("to_layout", lambda t, g, p: g(p["x"], p["layout"])),
    "typecast": (
        "typecast",
        lambda t, g, p: _values(g(p["x"], dtype=_float(t, p["dtype"]))),
    ),
    "copy": ("copy", lambda t, g, p: g(p["a"], p["b"].clone())),
    "fill_cache": ("fill_cache", lambda t, g, p: g(p["cache"].clone(), p["x"], p["batch_idx"])),
    "interleaved_to_sharded": ("interleaved_to_sharded", lambda t, g, p: g(p["x"])),
    "sparse_matmul": ("sparse_matmul", _sparse_matmul),
    "chunked_sdpa": ("transformer.chunked_scaled_dot_product_attention", _chunked_sdpa),
    "sdpa_decode": ("transformer.paged_scaled_dot_product_attention_decode", _sdpa_decode),
    "chunk_gated_delta_rule": ("transformer.chunk_gated_delta_rule", _chunk_gdr),
    "fused_recurrent_gated_delta_rule": (
        "transformer.fused_recurrent_gated_delta_rule",
        _recurrent_gdr,
    ),
}

# The virtual device's public attribute (``ttnn.<path>``) that issues each op: the tier wraps
# these to see a call's arguments (``linear`` calls ``matmul``; the CCLs are the mesh's).
ENTRY_POINTS = {
    "matmul": "matmul",
    "embedding": "embedding",
    "rms_norm": "rms_norm",
    **{op: op for op in ("add", "sub", "mul", "ge", "gt", "le", "lt", "eq")},
    **{op: op for op in ("sigmoid", "silu", "exp", "log", "rsqrt", "reciprocal", "softplus")},
    **{op: op for op in ("sum", "softmax", "topk", "argmax", "where", "reshape", "permute")},
    **{op: op for op in ("slice", "concat", "to_layout", "typecast", "copy", "fill_cache")},
    "interleaved_to_sharded": "interleaved_to_sharded",
    "sparse_matmul": "sparse_matmul",
    "chunked_sdpa": "transformer.chunked_scaled_dot_product_attention",
    "sdpa_decode": "transformer.paged_scaled_dot_product_attention_decode",
    "chunk_gated_delta_rule": "transformer.chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule": "transformer.fused_recurrent_gated_delta_rule",
}


def mesh_golden(
    ttnn: Any, op: str, shards: list[torch.Tensor], dim: int, line: list[int], chip: int
) -> torch.Tensor:
    """Chip ``chip``'s output of an experimental CCL along ``line`` (the chips of its
    ``cluster_axis`` line, mesh order): the plain collective's golden over the line's shards as
    a 1-D mesh, whose composed (global) result is the gathered tensor (all_gather: every chip
    holds it) or the reduced one sharded on ``dim`` (reduce_scatter: chip k holds chunk k)."""
    plain = {
        "all_gather_async": ttnn.all_gather,
        "reduce_scatter_minimal_async": ttnn.reduce_scatter,
    }
    g = ttnn.get_golden_function(plain[op])
    parts = [shards[i] for i in line]
    rank = parts[0].dim()
    d = dim % rank
    if op == "all_gather_async":
        # a stacking axis in front keeps each chip's copy apart in the composed result
        full = g(
            [x[None] for x in parts],
            d + 1,
            cluster_axis=0,
            _ttnn_golden_mesh_shape=(len(line),),
            _ttnn_golden_mesh_shard_dims=(0,),
        )
        return full[line.index(chip)]
    full = g(
        parts,
        d,
        cluster_axis=0,
        _ttnn_golden_mesh_shape=(len(line),),
        _ttnn_golden_mesh_shard_dims=(None,),
    )
    return torch.chunk(full, len(line), d)[line.index(chip)].contiguous()
