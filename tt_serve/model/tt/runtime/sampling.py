"""Device draws and logprobs of the ttnn backend (mirrors ``torch/sampling``): the token a
``RowSampling`` row gets is ``engine.sampler.draw`` of its logits and uniform, computed inside the
traced program so that a fed row can take a drawn id with no host round trip.

Candidates: the LM head runs in column chunks; each chunk gives its local top
``CANDIDATES`` (``ttnn.topk``), their ids offset to vocabulary ids; a second topk over the
concatenated chunk winners, labelled with those ids (``indices_tensor``), keeps the global top
``CANDIDATES`` (the two-stage top-k tt-metal uses for a vocabulary sharded across chips). A
device-drawn row has 1 <= top_k <= ``CANDIDATES`` (``TTBackend.max_device_top_k``), so its kept
set lies among them, with one documented limit: tokens tied with the k-th value that fall outside
the ``CANDIDATES`` are cut (the host keeps every tie).

The rules, on [rows, CANDIDATES] in float32, each a comparison of ratios so the softmax's
normalisation does not matter: softmax of the candidates / T; top-k keeps values >= the k-th
(ties included); min-p keeps p >= min_p x the largest; top-p keeps a candidate while the mass at
or after it in (value descending, id ascending) order exceeds (1 - top_p) x the kept mass; then
the inverse CDF over the kept candidates in **id order**: the token is the kept candidate with
the largest id whose exclusive cumulative mass is <= uniform x total (the host's "first whose
cumulative mass exceeds it"). Both orders come from 0/1 comparison matrices of the candidates
([rows, C, C], broadcast compares) and one batched matmul each, so nothing depends on the order
topk returns ties in (unspecified without ``stable``, which labels exclude). Row selections read
exact element copies (slice, topk of a one-hot select), never a reduction, so ids and the k-th
value are exact; sums differ from the host's float64 only at boundaries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tt_serve.model.interface import RowSampling
from tt_serve.model.tt.ops import Ops, Tensor

CANDIDATES = 32  # tt-metal's models sample after a topk with k <= 32
# Planes of the per-row sampling input [SAMPLING_PLANES, rows, CANDIDATES] (each value
# replicated along the candidates, so every rule is an elementwise op on equal shapes).
INV_TEMP, KTH_SELECT, MIN_P, TOP_P_CUT, UNIFORM, DRAW = range(6)
SAMPLING_PLANES = 6
# Below every finite logit: the score of a candidate a one-hot select does not take.
LOWEST = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class Candidates:
    """The top CANDIDATES logits of each row [1, R, C] (sorted by value; the order among ties
    is unspecified) and their vocabulary ids: uint32 and float32 (exact below 2^24)."""

    values: Tensor
    ids: Tensor
    ids_f: Tensor


def sampling_planes(specs: list[RowSampling | None]) -> np.ndarray:
    """The per-row sampling input [SAMPLING_PLANES, rows, CANDIDATES] float32 for one spec per row
    (None: argmax, neutral values that keep every rule finite)."""
    planes = np.zeros((SAMPLING_PLANES, len(specs), CANDIDATES), dtype=np.float32)
    planes[INV_TEMP] = 1.0
    planes[KTH_SELECT, :, 0] = 1.0
    for r, s in enumerate(specs):
        if s is None:
            continue
        if not 1 <= s.top_k <= CANDIDATES:
            raise ValueError(f"device draws need 1 <= top_k <= {CANDIDATES}, got {s.top_k}")
        planes[INV_TEMP, r] = 1.0 / s.temperature
        planes[KTH_SELECT, r] = 0.0
        planes[KTH_SELECT, r, s.top_k - 1] = 1.0
        planes[MIN_P, r] = s.min_p
        # 1 - top_p is what top-p may cut: 0 for top_p = 1 keeps every candidate exactly.
        planes[TOP_P_CUT, r] = 1.0 - s.top_p
        # float32 of a uniform just below 1 may round up to 1; keep it below.
        planes[UNIFORM, r] = min(np.float32(s.uniform), np.nextafter(np.float32(1), 0))
        planes[DRAW, r] = 1.0
    return planes


def candidates(
    ops: Ops, parts: list[Tensor], offsets: list[int], base: Tensor | None = None
) -> Candidates:
    """The global top CANDIDATES of logits given as column chunks ``parts`` [1, R, w_i] float32
    starting at vocabulary ids ``offsets`` (plus ``base``, a [1, 1, 1] float32 tensor: on a
    mesh each chip's first vocabulary id, so each chip's candidates carry global ids)."""
    if len(parts) == 1 and base is None:
        values, ids = ops.topk(parts[0], CANDIDATES)
        return Candidates(values, ids, ops.typecast(ids, "float32"))
    if len(parts) == 1:
        values, pos = ops.topk(parts[0], CANDIDATES)
        ids_f = ops.add(ops.typecast(pos, "float32"), base)
        return Candidates(values, ops.typecast(ids_f, "uint32"), ids_f)
    local = [ops.topk(p, CANDIDATES) for p in parts]
    # Chunk positions -> vocabulary ids (exact in float32); the offsets are constants of the
    # captured program like the slice bounds that cut the chunks.
    labels_f = [
        ops.add(ops.typecast(i, "float32"), float(a))
        for (_, i), a in zip(local, offsets, strict=True)
    ]
    cat = ops.concat(labels_f, -1)
    labels = ops.typecast(cat if base is None else ops.add(cat, base), "uint32")
    values, ids = ops.topk(ops.concat([v for v, _ in local], -1), CANDIDATES, labels=labels)
    return Candidates(values, ids, ops.typecast(ids, "float32"))


def mesh_candidates(
    ops: Ops, local: Candidates, gather: Callable[[Tensor], Tensor]
) -> tuple[Candidates, Tensor]:
    """The second stage across chips of a vocabulary-sharded LM head (tt-metal's
    models/common/sampling/tt_sampling.py: local top-k, all-gather values and global ids, the
    final pick on the replicated candidate set): each chip's ``local`` candidates (global ids)
    are gathered, the global top CANDIDATES kept, and the greedy id picked as the lowest id
    among the candidates equal to the largest value (what ``argmax`` over the whole vocabulary
    returns; exact while at most CANDIDATES tokens per chip tie with the maximum). Returns the
    candidates and the greedy ids [1, R] uint32 ROW_MAJOR (``draw``'s ``greedy``)."""
    values, ids_f = gather(local.values), gather(local.ids_f)  # [1, R, C x chips]
    top, ids = ops.topk(values, CANDIDATES, labels=ops.typecast(ids_f, "uint32"))
    rows = top.shape[1]
    peak = ops.slice(top, [0, 0, 0], [1, rows, 1])
    neg_low, _ = ops.topk(ops.where(ops.eq(values, peak), ops.mul(ids_f, -1.0), LOWEST), 1)
    greedy = ops.to_row_major(ops.typecast(ops.mul(neg_low, -1.0), "uint32"))
    return Candidates(top, ids, ops.typecast(ids, "float32")), ops.reshape(greedy, [1, rows])


def _pick(ops: Ops, x: Tensor, select: Tensor) -> Tensor:
    """The element of each row of ``x`` [1, R, C] that the one-hot ``select`` marks, [1, R, 1]:
    a topk copies it exactly (a sum would round it through the reduction)."""
    value, _ = ops.topk(ops.where(select, x, LOWEST), 1)
    return value


def draw(ops: Ops, cand: Candidates, planes: Tensor, greedy: Tensor, compute: Any) -> Tensor:
    """Each row's token: its draw where the DRAW plane is set, else ``greedy`` (argmax ids
    [1, R] uint32 ROW_MAJOR); returns the same layout, ready for ``out_ids``. ``compute``: the
    two mass matmuls' kernel config (fp32 accumulation)."""
    rows = cand.values.shape[1]

    def plane(i: int) -> Tensor:
        return ops.slice(planes, [i, 0, 0], [i + 1, rows, CANDIDATES])

    v, ids = cand.values, cand.ids_f
    p = ops.softmax(ops.mul(v, plane(INV_TEMP)))
    keep = ops.ge(v, _pick(ops, v, plane(KTH_SELECT)))  # top-k, ties with the k-th included
    largest = ops.slice(p, [0, 0, 0], [1, rows, 1])  # candidates are sorted: column 0
    keep = ops.mul(keep, ops.ge(p, ops.mul(plane(MIN_P), largest)))
    q = ops.mul(p, keep)  # p is finite, so a 0/1 mask multiply is exact

    v_col, v_row = ops.reshape(v, [rows, CANDIDATES, 1]), ops.reshape(v, [rows, 1, CANDIDATES])
    i_col, i_row = ops.reshape(ids, [rows, CANDIDATES, 1]), ops.reshape(ids, [rows, 1, CANDIDATES])
    # at_or_after[r, i, j]: candidate i does not precede j in (value desc, id asc) order.
    after = ops.add(ops.lt(v_col, v_row), ops.mul(ops.eq(v_col, v_row), ops.ge(i_col, i_row)))
    tail = ops.reshape(
        ops.matmul(ops.reshape(q, [rows, 1, CANDIDATES]), after, compute), [1, rows, CANDIDATES]
    )
    keep_p = ops.gt(tail, ops.mul(plane(TOP_P_CUT), ops.sum(q, -1)))
    q = ops.mul(q, keep_p)

    # cdf[r, j] = mass of the kept candidates with id <= id_j (the host's id order).
    by_id = ops.le(i_col, i_row)
    cdf = ops.reshape(
        ops.matmul(ops.reshape(q, [rows, 1, CANDIDATES]), by_id, compute), [1, rows, CANDIDATES]
    )
    target = ops.mul(plane(UNIFORM), ops.sum(q, -1))
    below = ops.mul(ops.le(ops.sub(cdf, q), target), ops.gt(q, 0.0))
    # The smallest kept id has exclusive mass 0 <= target, so some candidate always qualifies.
    drawn, _ = ops.topk(ops.where(below, ids, -1.0), 1)  # [1, R, 1]: the largest such id

    greedy_f = ops.typecast(ops.to_tile(ops.reshape(greedy, [1, rows, 1])), "float32")
    flag = ops.slice(plane(DRAW), [0, 0, 0], [1, rows, 1])
    chosen = ops.typecast(ops.where(flag, drawn, greedy_f), "uint32")
    return ops.reshape(ops.to_row_major(chosen), [1, rows])


def candidate_logprobs(
    ops: Ops,
    logits: Tensor,
    cand: Candidates,
    across: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """log_softmax of the raw logits [1, R, vocab] at the candidates, [1, R, C] float32: every
    device-picked token is a candidate (argmax is the first), and the top logprobs are their
    first ones. The log-normaliser runs over the whole vocabulary: on a mesh ``logits`` is the
    chip's vocabulary shard and ``across`` sums the chips' [1, R, 1] partial sums."""
    rows = logits.shape[1]
    peak = ops.slice(cand.values, [0, 0, 0], [1, rows, 1])  # the row's largest logit
    total = ops.sum(ops.exp(ops.sub(logits, peak)), -1)
    if across is not None:
        total = across(total)
    return ops.sub(cand.values, ops.add(peak, ops.log(total)))


def logprob_dict(chosen: int, ids: np.ndarray, logprobs: np.ndarray, k: int) -> dict[int, float]:
    """{chosen: logprob} plus the k most likely, from one row's candidates (ids and logprobs
    [CANDIDATES], sorted by logprob), as ``tt_serve.logprobs.top_logprobs`` builds it."""
    order = np.argsort(-logprobs, kind="stable")
    out = {int(ids[j]): float(logprobs[j]) for j in order[:k]}
    hit = np.flatnonzero(ids == chosen)
    out[int(chosen)] = float(logprobs[hit[0]])
    return out
