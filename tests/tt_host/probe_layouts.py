"""Run by the ttnn venv under a mock cluster descriptor: host tensors built by the backend's
own layout code with the real ttnn.Tensor must match numpy. Prints "TTNN_PROBE_RESULT " + JSON {"checks": [...]}."""

import json

import ml_dtypes
import numpy as np
import ttnn

from tt_serve.model.buckets import fit_table
from tt_serve.model.interface import StepRow
from tt_serve.model.precision import Precision
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout import ROW_MAJOR, TILE
from tt_serve.model.tt.layout.checkpoint import layout_weights
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.runtime.buffers import DECODE_FIELDS, PREFILL_FIELDS
from tt_serve.model.tt.runtime.inputs import (
    decode_values,
    prefill_values,
    rope_tables,
)

ops = Ops(ttnn)
checks = []


def back(t):
    if t.dtype in (ttnn.bfloat8_b, ttnn.bfloat4_b):
        # Host to_layout of a padded block-float tile tensor TT_FATALs ("Tensor layout must
        # be ROW_MAJOR for unpadding"); to_numpy unpacks it to float32 at the logical shape.
        return np.asarray(t.to_numpy())
    if t.layout == ttnn.TILE_LAYOUT:
        t = ttnn.to_layout(t, ttnn.ROW_MAJOR_LAYOUT)
    if t.dtype == ttnn.bfloat16:
        t = ttnn.typecast(t, ttnn.float32)
    return np.asarray(t.to_numpy())


def bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def check(name, ok, detail=""):
    checks.append({"name": name, "ok": bool(ok), "detail": str(detail)})


spec = ModelSpec.from_config(
    {
        "model_type": "qwen3_5_text",
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 96,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 32,
        "linear_value_head_dim": 32,
        "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    }
)
rng = np.random.default_rng(0)

# Paged KV pool layout: [blocks, kv_heads, block_size, head_dim] bf16 TILE, already tile-aligned.
kv = rng.standard_normal((3, spec.num_kv_heads, 64, spec.head_dim)).astype(np.float32)
t = ops.host(kv, "bfloat16", TILE)
check("kv_pool_padded_shape", list(t.padded_shape) == list(kv.shape), t.padded_shape)
check("kv_pool_bf16_round_trip", np.array_equal(back(t), bf16(kv)))

# Page tables: int32 ROW_MAJOR, padded with the padding block.
pt = np.array(
    [fit_table(StepRow(1, (4,), 0, (5, 9, 2), 0, True), 8, held_by="traces")], dtype=np.int32
)
t = ops.host(pt, "int32", ROW_MAJOR)
check("page_table_int32", t.dtype == ttnn.int32 and np.array_equal(back(t), pt), back(t))

# Every persistent input of both programs, with the dtype/layout the buffers use.
row = StepRow(1, tuple(range(1, 41)), 64, (3, 4, 5), 1, True)
pv = prefill_values(
    row,
    bucket=64,
    block_size=64,
    width=8,
    num_v_heads=4,
    conv_state_len=3,
)
dv = decode_values(
    [StepRow(2, (7,), 70, (3, 4), 1, True)],
    num_rows=3,
    width=8,
    num_v_heads=4,
)
for label, values, fields in (("prefill", pv, PREFILL_FIELDS), ("decode", dv, DECODE_FIELDS)):
    for name, (dtype, layout) in fields.items():
        dtype = "bfloat16" if dtype == "act" else dtype
        arr = np.asarray(getattr(values, name))
        t = ops.host(arr, dtype, layout)
        want = bf16(arr) if dtype == "bfloat16" else arr
        got = back(t)
        ok = list(t.shape) == list(arr.shape) and np.array_equal(got.astype(want.dtype), want)
        check(f"{label}_{name}", ok, f"{t.shape} {t.dtype}")

# The resident RoPE tables: [positions, hd] bf16 ROW_MAJOR (the embedding op's table layout).
cos, _ = rope_tables(np.arange(512), 32, 16, 1e4)
t = ops.host(cos, "bfloat16", ROW_MAJOR)
check("rope_table_bf16_rm", list(t.shape) == [512, 32] and np.array_equal(back(t), bf16(cos)))

# Weights in every precision: transposed [in, out], bf16 exact rounding, bfloat8_b close.
names = {}
for i in range(spec.num_layers):
    p = f"layers.{i}."
    names[p + "input_layernorm.weight"] = (64,)
    names[p + "post_attention_layernorm.weight"] = (64,)
    for n in ("gate", "up"):
        names[p + f"mlp.{n}_proj.weight"] = (96, 64)
    names[p + "mlp.down_proj.weight"] = (64, 96)
    if i == 3:
        a = p + "self_attn."
        names.update(
            {
                a + "q_proj.weight": (256, 64),
                a + "k_proj.weight": (64, 64),
                a + "v_proj.weight": (64, 64),
                a + "o_proj.weight": (64, 128),
                a + "q_norm.weight": (32,),
                a + "k_norm.weight": (32,),
            }
        )
    else:
        g = p + "linear_attn."
        names.update(
            {
                g + "in_proj_qkv.weight": (256, 64),
                g + "in_proj_z.weight": (128, 64),
                g + "in_proj_b.weight": (4, 64),
                g + "in_proj_a.weight": (4, 64),
                g + "out_proj.weight": (64, 128),
                g + "norm.weight": (32,),
                g + "conv1d.weight": (256, 4),
                g + "A_log": (4,),
                g + "dt_bias": (4,),
            }
        )
names.update({"embed_tokens.weight": (512, 64), "norm.weight": (64,), "lm_head.weight": (512, 64)})
w = {n: rng.standard_normal(s).astype(np.float32) * 0.1 for n, s in names.items()}
for prec_name in ("bfloat16", "mixed", "bfp4-mlp"):
    prec = Precision.named(prec_name)
    for key, hw in layout_weights(spec, w, prec).items():
        t = ops.host(hw.array, hw.dtype, hw.layout)
        got = back(t)
        if hw.dtype == "bfloat8_b":
            # 7-bit mantissas against each 16-value block's shared exponent: the step is 2^-6 of
            # the block's top power of two, so even truncation errs by < 2^-6 (0.016) of the max.
            err = float(np.abs(got - hw.array).max() / (np.abs(hw.array).max() + 1e-12))
            ok = got.shape == hw.array.shape and err < 0.02
        elif hw.dtype == "bfloat4_b":
            # 3-bit mantissas against the block's shared exponent: the step is 2^-2 of the
            # block's top power of two, so the error stays < 2^-2 of the max.
            err = float(np.abs(got - hw.array).max() / (np.abs(hw.array).max() + 1e-12))
            ok = got.shape == hw.array.shape and err < 0.25
        elif hw.dtype == "bfloat16":
            ok = np.array_equal(got, bf16(hw.array))
        else:
            ok = np.array_equal(got, hw.array)
        check(f"weight_{prec_name}_{key}", ok, f"{hw.dtype} {t.shape}")
lm = layout_weights(spec, w, Precision())["lm_head"].array
check("lm_head_transposed", lm.shape == (64, 512) and np.array_equal(lm, w["lm_head.weight"].T))

print("TTNN_PROBE_RESULT " + json.dumps({"checks": checks}))
