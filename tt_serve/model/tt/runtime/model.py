"""The hybrid decoder stack on the device (mirrors ``torch/model.py``).

Two programs, each a pure function of persistent buffers so it can be captured as a trace:
``prefill`` runs one row of a bucket through every layer (state in the working buffers) and
``decode`` runs every state slot as one batch row (slot s in row s; state in the pools). Both
end by picking each row's token on the device (argmax to uint32, or a ``RowSampling`` draw,
``sampling.py``) and copying ids, logits and the candidates' ids and logprobs into their output
buffers. Decode takes each row's input id from the host or, for a fed row, from the previous
replay's ``out_ids`` (a per-row select inside the trace).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tt_serve.model.precision import FIDELITY, Precision
from tt_serve.model.spec import FULL_ATTENTION, ModelSpec
from tt_serve.model.tt.layout import ROW_MAJOR
from tt_serve.model.tt.layout.experts import MoeDispatch, expert_groups
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.ops import Ops, Tensor
from tt_serve.model.tt.runtime.attention import (
    AttentionWeights,
    SdpaConfigs,
    attention_decode,
    attention_prefill,
)
from tt_serve.model.tt.runtime.buffers import InputBuffers
from tt_serve.model.tt.runtime.ccl import TensorParallelCCL
from tt_serve.model.tt.runtime.gdn import KERNEL_CHUNK, GdnWeights, gdn_decode, gdn_prefill
from tt_serve.model.tt.runtime.inputs import gdn_const_tiles, rope_tables, rotation_matrix
from tt_serve.model.tt.runtime.layers import swiglu
from tt_serve.model.tt.runtime.moe import ExpertGroup, MoeWeights, SparseExperts, moe_forward
from tt_serve.model.tt.runtime.pools import DevicePools
from tt_serve.model.tt.runtime.sampling import candidate_logprobs, candidates, draw, mesh_candidates

# Chunked (prefill) SDPA: q/k chunk 64 as qwen36 and tt_transformers below 2048 tokens; a chunk
# start (a multiple of the block size) must be a multiple of both, so 32 when the block is not.
SDPA_PREFILL_CHUNK = 64
# Paged decode SDPA: one core per (user, kv head) and k chunk 128, qwen36's workaround for the
# cross-core tree-reduction bug (tt-metal PR #49703); exact exp, HiFi2 without approximations
# (tt_transformers' "hifi2na" decode recipe).
SDPA_DECODE_K_CHUNK = 128
# The LM head is split into column chunks of at most this many vocab entries (tile-aligned), so
# a 248k vocab is several mid-size matmuls rather than one [H x 248320] program.
LM_HEAD_CHUNK = 32768


@dataclass(frozen=True)
class Layer:
    input_norm: Tensor
    post_norm: Tensor
    mixer: GdnWeights | AttentionWeights
    mlp: tuple[Tensor, Tensor, Tensor] | MoeWeights
    pool_index: int
    mlp_compute: Any = None


class TTModel:
    """Device weights plus the two traceable programs; all sequence state lives in pools.

    On a mesh (``tp``) the programs are SPMD: every chip runs them on its shards with the
    per-chip head counts of ``parallel.TensorParallel``; each row-parallel projection's partial
    sums are all-reduced before the residual add (``ccl.py``: the mixers' over the columns and
    their row pieces gathered, the MLP's over every chip), so the residual stream is
    replicated, and the LM head is vocabulary-sharded over every chip (``_head``)."""

    def __init__(
        self,
        ops: Ops,
        spec: ModelSpec,
        w: dict[str, Tensor],
        precision: Precision,
        tp: TensorParallel | None = None,
        num_links: int | tuple[int, int] = 1,
        *,
        moe_dispatch: MoeDispatch = "sparse",
    ) -> None:
        self.ops, self.spec, self.precision = ops, spec, precision
        self.tp = tp or TensorParallel(spec, 1)
        self.ccl = TensorParallelCCL(ops, self.tp.mesh, num_links)
        # One compute kernel config per weight dtype (math fidelity to match), one exact (HiFi4)
        # for bf16 weights and the one-hot / rotation matmuls.
        self.kernels = {d: ops.compute_config(f, fp32_acc=acc) for d, (f, acc) in FIDELITY.items()}
        self.exact = self.kernels["bfloat16"]
        self.sampling_compute = ops.compute_config("HiFi4", fp32_acc=True)  # float32 masses
        self.embed, self.norm = w["embed"], w["norm"]
        self.lm_head = self._split_head(w["lm_head"], self.tp.vocab)
        widths = [int(t.shape[1]) for t in self.lm_head]
        self.head_offsets = [sum(widths[:i]) for i in range(len(widths))]
        self.moe_dispatch = moe_dispatch
        self._expert_select: Tensor = None  # [E, E/N] one-hot, column-sharded (a mesh only)
        self.layers = [self._layer(spec, w, i) for i in range(spec.num_layers)]
        self.rot = ops.upload(rotation_matrix(spec.head_dim, spec.rotary_dim), "bfloat16")
        self.cos_table: Tensor = None
        self.sin_table: Tensor = None
        eye, tril, ones, masks = (ops.upload(a, "float32") for a in gdn_const_tiles(KERNEL_CHUNK))
        self.gdn_consts = (eye, tril, ones, masks)
        self.sdpa_decode = SdpaConfigs(
            ops.sdpa_program_config(0, SDPA_DECODE_K_CHUNK, max_cores_per_head_batch=1),
            ops.compute_config("HiFi2"),
        )
        self._sdpa_prefill: dict[int, SdpaConfigs] = {}
        self.conv_config: Any = ops.conv_program_config(_channel_chunk(self.tp.conv_dim))
        # Each chip's first vocabulary id [1, 1, 1] (its candidates' ids become global).
        self.vocab_base: Tensor = None
        if self.tp.degree > 1:
            bases = np.arange(self.tp.degree, dtype=np.float32) * self.tp.vocab
            self.vocab_base = ops.upload(bases.reshape(1, 1, -1), "float32", shard_dim=-1)
        # fused_recurrent_gated_delta_rule puts one core per (row, value head) and refuses more
        # than the grid (its program factory's TT_FATAL): decode runs it in row groups.
        self.gdn_rows_per_call = max(1, ops.num_worker_cores() // max(self.tp.v_heads, 1))

    def _split_head(self, head: Tensor, vocab: int) -> list[Tensor]:
        """[H, vocab] -> column chunks of at most LM_HEAD_CHUNK (tile-aligned); the whole
        tensor is freed once split."""
        if vocab <= LM_HEAD_CHUNK:
            return [head]
        n = -(-vocab // LM_HEAD_CHUNK)
        width = -(-vocab // (n * 32)) * 32
        rows = head.shape[0]
        chunks = [
            self.ops.slice(head, [0, a], [rows, min(vocab, a + width)])
            for a in range(0, vocab, width)
        ]
        self.ops.deallocate(head)
        return chunks

    def _layer(self, spec: ModelSpec, w: dict[str, Tensor], i: int) -> Layer:
        p, prec, k = f"{i}.", self.precision, self.kernels
        mixer: GdnWeights | AttentionWeights
        if spec.layer_types[i] == FULL_ATTENTION:
            mixer = AttentionWeights(
                qkv=w[p + "qkv"],
                gate=w[p + "gate"],
                o=w[p + "o"],
                q_norm=w[p + "q_norm"],
                k_norm=w[p + "k_norm"],
                num_heads=self.tp.heads,
                num_kv_heads=self.tp.kv_heads,
                head_dim=spec.head_dim,
                eps=spec.rms_norm_eps,
                compute=k[prec.attention],
                exact=self.exact,
                rows=self.ccl.gather_rows,
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
                num_k_heads=self.tp.k_heads,
                num_v_heads=self.tp.v_heads,
                head_k_dim=spec.linear_key_head_dim,
                head_v_dim=spec.linear_value_head_dim,
                eps=spec.rms_norm_eps,
                compute=k[prec.gdn],
                exact=self.exact,
                rows=self.ccl.gather_rows,
            )
            rank = spec.gdn_layers.index(i)
        mlp: tuple[Tensor, Tensor, Tensor] | MoeWeights
        if spec.is_moe_layer(i):
            mlp = MoeWeights(
                router=w[p + "router"],
                experts=self._experts(w, p),
                shared=(w[p + "shared.gate"], w[p + "shared.up"], w[p + "shared.down"]),
                shared_gate=w[p + "shared_gate"],
                top_k=spec.num_experts_per_tok,
                norm_topk_prob=spec.norm_topk_prob,
                compute=k[prec.experts],
                shared_compute=k[prec.mlp],
                exact=self.exact,
            )
        else:
            mlp = (w[p + "mlp.gate"], w[p + "mlp.up"], w[p + "mlp.down"])
        return Layer(w[p + "input_norm"], w[p + "post_norm"], mixer, mlp, rank, k[prec.mlp])

    def _experts(self, w: dict[str, Tensor], p: str) -> tuple[ExpertGroup, ...] | SparseExperts:
        """A MoE layer's routed experts as its dispatch reads them (``moe.py``): the sparse
        path's per-chip experts and, on a mesh, the one-hot that picks the chip's experts'
        routing columns (uploaded once for every layer); or the dense path's stacked groups."""
        s = self.spec
        if self.moe_dispatch == "dense":
            groups = expert_groups(s.num_experts, s.moe_intermediate_size)
            return tuple(
                ExpertGroup(
                    w[f"{p}experts.{j}.gate"],
                    w[f"{p}experts.{j}.up"],
                    w[f"{p}experts.{j}.down"],
                    first,
                )
                for j, (first, _) in enumerate(groups)
            )
        if self.tp.degree > 1 and self._expert_select is None:
            eye = np.eye(s.num_experts, dtype=np.float32)
            self._expert_select = self.ops.upload(eye, "bfloat16", shard_dim=-1)
        return SparseExperts(w[p + "experts.gate_up"], w[p + "experts.down"], self._expert_select)

    def upload_rope(self, num_positions: int, dtype: str) -> None:
        """cos/sin [positions, hd] resident on the device, uploaded once (ROW_MAJOR: the
        embedding op's table layout); programs gather their rows by position."""
        s = self.spec
        cos, sin = rope_tables(np.arange(num_positions), s.head_dim, s.rotary_dim, s.rope_theta)
        self.cos_table = self.ops.upload(cos, dtype, ROW_MAJOR)
        self.sin_table = self.ops.upload(sin, dtype, ROW_MAJOR)

    def rope(self, inp: InputBuffers, n: int, *, head_major: bool) -> tuple[Tensor, Tensor, Tensor]:
        """(cos, sin, rotation) at ``inp.positions``, gathered on the device: cos/sin
        [1, 1, n, hd] for head-major (prefill) q/k, [1, n, 1, hd] for row-major (decode)."""
        ops, hd = self.ops, self.spec.head_dim
        shape = [1, 1, n, hd] if head_major else [1, n, 1, hd]
        cos = ops.reshape(ops.embedding(inp.positions, self.cos_table), shape)
        sin = ops.reshape(ops.embedding(inp.positions, self.sin_table), shape)
        return cos, sin, self.rot

    def sdpa_prefill(self, block_size: int) -> SdpaConfigs:
        """The chunked SDPA configs for chunk starts that are multiples of ``block_size``
        (exact exp, HiFi4 with fp32 accumulation as tt_transformers' prefill)."""
        if block_size not in self._sdpa_prefill:
            chunk = SDPA_PREFILL_CHUNK if block_size % SDPA_PREFILL_CHUNK == 0 else 32
            self._sdpa_prefill[block_size] = SdpaConfigs(
                self.ops.sdpa_program_config(chunk, chunk),
                self.ops.compute_config("HiFi4", fp32_acc=True),
            )
        return self._sdpa_prefill[block_size]

    def _mlp(self, x: Tensor, layer: Layer, inp: InputBuffers) -> Tensor:
        if isinstance(layer.mlp, MoeWeights):
            # the rows whose output is used (valid tokens, active decode rows): gate_mask's
            # first column; the others route to no expert
            mask = inp.gate_mask
            rows = self.ops.slice(mask, [0, 0, 0], [1, mask.shape[1], 1]) if mask.shape[2] else None
            return moe_forward(self.ops, x, layer.mlp, rows)
        return swiglu(self.ops, x, *layer.mlp, layer.mlp_compute)

    def _head(self, h: Tensor, inp: InputBuffers) -> None:
        """Logits (each chip its vocabulary shard on a mesh) and the picks: on one chip the
        argmax and the two-stage candidates over the LM-head chunks; on a mesh each chip's
        local candidates with global ids, gathered, then the final pick on every chip
        (``sampling.mesh_candidates``) and the log-normaliser summed across chips."""
        ops = self.ops
        normed = ops.rms_norm(h, self.norm, self.spec.rms_norm_eps)
        head = self.kernels[self.precision.lm_head]
        parts = [ops.typecast(ops.linear(normed, c, head), "float32") for c in self.lm_head]
        logits = parts[0] if len(parts) == 1 else ops.concat(parts, -1)
        ops.copy(logits, inp.out_logits)
        across: Callable[[Tensor], Tensor] | None = None
        if self.tp.degree == 1:
            cand = candidates(ops, parts, self.head_offsets)
            greedy = ops.argmax(logits)
        else:
            local = candidates(ops, parts, self.head_offsets, base=self.vocab_base)
            cand, greedy = mesh_candidates(ops, local, lambda t: self.ccl.gather_all(t, -1))
            across = self._sum_across
        ops.copy(draw(ops, cand, inp.sampling, greedy, self.sampling_compute), inp.out_ids)
        ops.copy(cand.ids, inp.out_top_ids)
        ops.copy(candidate_logprobs(ops, logits, cand, across), inp.out_top_logprobs)

    def _sum_across(self, t: Tensor) -> Tensor:
        """[1, R, 1] partial sums -> their sum over the chips, gathered on dim 0: a tile-padded
        last dim would take the composite gather, unsafe under trace (``all_gather_async`` in
        ``virtual/rules_ccl.py``)."""
        return self.ops.sum(self.ccl.gather_all(t, 0), 0)

    def _decode_ids(self, inp: InputBuffers) -> Tensor:
        """Each row's input id: the previous replay's pick for a fed row, else the host's
        (a select in float32, exact for ids below 2^24: ``where`` takes TILE operands, the
        embedding UINT32 ROW_MAJOR ids)."""
        ops = self.ops
        prev = ops.typecast(ops.to_tile(inp.out_ids), "float32")
        host = ops.typecast(ops.to_tile(inp.ids), "float32")
        return ops.to_row_major(ops.typecast(ops.where(inp.fed, prev, host), "uint32"))

    def prefill(self, inp: InputBuffers, pools: DevicePools) -> None:
        """One bucket of one row through all layers; state in ``pools.*_work``."""
        ops, eps = self.ops, self.spec.rms_norm_eps
        self.ccl.restart()
        sdpa = self.sdpa_prefill(pools.block_size)
        # Embedding and norms are replicated: the residual x [1, T, H] is whole on every chip.
        x = ops.embedding(inp.ids, self.embed)  # [1, T, H]
        rope = self.rope(inp, x.shape[1], head_major=True)
        for layer in self.layers:
            h = ops.rms_norm(x, layer.input_norm, eps)  # replicated in, replicated out
            j = layer.pool_index
            # The mixer takes the replicated h and its chip's heads (KV / GDN state: the chip's
            # column share) and returns partial sums of its row-parallel output projection:
            # fractured, [1, T, H] per chip on 1 x N, [1, T, H/R] (row r's piece) on R x C.
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
                h = attention_prefill(ops, h, layer.mixer, inp, pools.k[j], pools.v[j], rope, sdpa)
            # Summed over the columns and the rows' pieces gathered: replicated again.
            x = ops.add(x, self.ccl.reduce_heads(h))
            # The MLP (or the experts) takes replicated input and leaves partial sums on every
            # chip (its intermediate dim split over all R·C chips): all-reduced to replicated.
            mlp = self._mlp(ops.rms_norm(x, layer.post_norm, eps), layer, inp)
            x = ops.add(x, self.ccl.all_reduce(mlp))
        # The head takes the replicated last token; logits stay vocabulary-sharded per chip,
        # the picks are gathered and replicated (``_head``).
        self._head(ops.matmul(inp.last_select, x, self.exact), inp)  # the last valid token only

    def decode(self, inp: InputBuffers, pools: DevicePools) -> None:
        """One token for every pool row, i.e. state slot (idle slots are masked); pools updated in
        place."""
        ops, eps = self.ops, self.spec.rms_norm_eps
        self.ccl.restart()
        # Ids and embedding replicated: x [1, S, H] whole on every chip (S: every state slot).
        x = ops.embedding(self._decode_ids(inp), self.embed)  # [1, S, H]
        rope = self.rope(inp, x.shape[1], head_major=False)
        for layer in self.layers:
            h = ops.rms_norm(x, layer.input_norm, eps)  # replicated in, replicated out
            j = layer.pool_index
            # Replicated in; the chip's heads and state; row-parallel partial sums out
            # (fractured: [1, S, H] per chip on 1 x N, row r's [1, S, H/R] on R x C).
            if isinstance(layer.mixer, GdnWeights):
                h = gdn_decode(
                    ops, h, layer.mixer, inp, pools.conv[j], pools.rec[j], self.gdn_rows_per_call
                )
            else:
                h = attention_decode(
                    ops, h, layer.mixer, inp, pools.k[j], pools.v[j], rope, self.sdpa_decode
                )
            x = ops.add(x, self.ccl.reduce_heads(h))  # summed and gathered: replicated
            # Replicated in, partial sums on every chip out, all-reduced back to replicated.
            mlp = self._mlp(ops.rms_norm(x, layer.post_norm, eps), layer, inp)
            x = ops.add(x, self.ccl.all_reduce(mlp))
        self._head(x, inp)  # vocabulary-sharded logits; picks gathered and replicated


def _channel_chunk(channels: int, target: int = 768) -> int:
    """Largest tile-aligned divisor of the conv channels not above ``target``."""
    best = 32
    for c in range(32, min(channels, target) + 1, 32):
        if channels % c == 0:
            best = c
    return best
