"""The offline API (``LLM``) and the one place that turns options into a running engine.

Both ``LLM`` and the HTTP server call ``build_engine``: a backend is loaded, pool sizes are
derived from the model and the memory at hand unless given, and the engine allocates every
pool once, up front.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tt_serve.engine.engine import Engine, EngineConfig, TextStreamFactory
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.sequence import RequestError, RequestOutput, SamplingParams

if TYPE_CHECKING:
    from tt_serve.model.interface import Backend
    from tt_serve.model.spec import ModelSpec
    from tt_serve.tokenizer import Tokenizer

log = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 64
DEFAULT_CHUNK = 256
DEFAULT_MAX_BATCH = 16
DEFAULT_SNAPSHOT_SLOTS = 32
# Fraction of free host memory the KV pool and snapshots may take on the CPU backend.
CPU_MEMORY_FRACTION = 0.25
CPU_MEMORY_CAP = 8 << 30


@dataclass(frozen=True)
class EngineOptions:
    """Everything ``build_engine`` needs; None means "derive from the model and memory"."""

    model: str
    backend: str = "torch"
    device: str = "cpu"
    dtype: str = "float32"
    prefix_caching: bool = True
    block_size: int = DEFAULT_BLOCK_SIZE
    chunk: int = DEFAULT_CHUNK
    kv_blocks: int | None = None
    snapshot_slots: int | None = None
    max_batch: int = DEFAULT_MAX_BATCH
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    mixed_steps: bool = True
    traced: bool = False  # traced prefill (ttnn traces / CUDA graphs)
    device_resident: bool = False


def load_backend(opts: EngineOptions, max_model_len: int) -> tuple[Backend, ModelSpec]:
    if opts.backend == "torch":
        from tt_serve.model.ref.backend import TorchBackend

        # On CUDA, traced prefill means CUDA graphs for prefill chunk buckets and decode batch
        # buckets; device residency rides on the graphed decode path.
        graphs = opts.device.startswith("cuda") and (opts.traced or opts.device_resident)
        tb = TorchBackend.from_pretrained(
            opts.model,
            device=opts.device,
            dtype=opts.dtype,
            cuda_graphs=graphs,
            traced_prefill=graphs and opts.traced,
            device_resident=graphs and opts.device_resident,
            max_prefill_chunk=opts.chunk,
            max_model_len=max_model_len,
        )
        return tb, tb.spec
    if opts.backend == "ttnn":
        from tt_serve.model.tt.backend import TTBackend

        tt = TTBackend.from_pretrained(
            opts.model,
            device=opts.device,
            dtype=opts.dtype,
            traced=opts.traced,
            device_resident=opts.device_resident,
            max_prefill_chunk=opts.chunk,
        )
        return tt, tt.spec
    raise ValueError(f"unknown backend {opts.backend!r}; choose 'torch' or 'ttnn'")


def _available_memory() -> int:
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        return 4 << 30


def size_pools(opts: EngineOptions, spec: ModelSpec, max_model_len: int) -> tuple[int, int]:
    """(KV blocks incl. the padding block, snapshot slots) from the options or from memory.

    Enough KV for every running row to reach the full context is the ceiling; the memory budget
    (a quarter of free host memory on CPU, capped) is the floor that usually wins."""
    dtype_bytes = 4 if opts.dtype == "float32" else 2
    per_block = max(spec.kv_bytes_per_block(opts.block_size, dtype_bytes), 1)
    per_snap = max(spec.state_bytes_per_slot(), 1)
    budget = int(min(_available_memory() * CPU_MEMORY_FRACTION, CPU_MEMORY_CAP))
    snaps = opts.snapshot_slots
    if snaps is None:
        snaps = (
            0
            if not opts.prefix_caching
            else max(1, min(DEFAULT_SNAPSHOT_SLOTS, budget // 4 // per_snap))
        )
    blocks = opts.kv_blocks
    if blocks is None or blocks == 0:
        per_seq = -(-max_model_len // opts.block_size)
        want = opts.max_batch * per_seq + 1
        blocks = max(per_seq + 1, min(want, (budget - snaps * per_snap) // per_block))
    return blocks, snaps


def build_engine(
    opts: EngineOptions, *, tokenizer: Tokenizer | None = None
) -> tuple[Engine, ModelSpec]:
    from tt_serve.model.spec import ModelSpec

    limit = ModelSpec.from_hf_dir(opts.model).max_position_embeddings
    max_len = min(opts.max_model_len or limit, limit)
    backend, spec = load_backend(opts, max_len)
    blocks, snaps = size_pools(opts, spec, max_len)
    eos = set(spec.eos_token_ids)
    if tokenizer is not None:
        eos |= set(tokenizer.eos_token_ids)
    config = EngineConfig(
        scheduler=SchedulerConfig(
            max_batch=opts.max_batch,
            max_num_batched_tokens=opts.max_num_batched_tokens,
            chunk=opts.chunk,
            block_size=opts.block_size,
            mixed_steps=opts.mixed_steps,
        ),
        num_kv_blocks=blocks,
        num_snapshot_slots=snaps,
        max_model_len=max_len,
        vocab_size=spec.vocab_size,
        eos_token_ids=frozenset(eos),
        prefix_caching=opts.prefix_caching,
        cache_salt=f"{spec.model_id}|{opts.dtype}".encode(),
    )
    streams: TextStreamFactory | None = None
    if tokenizer is not None:
        from tt_serve.engine.text import text_stream_factory

        streams = text_stream_factory(tokenizer)
    log.info(
        "engine: %d KV blocks x %d tokens, %d snapshot slots, chunk %d, max batch %d",
        blocks,
        opts.block_size,
        snaps,
        opts.chunk,
        opts.max_batch,
    )
    return Engine(backend, config, text_streams=streams), spec


def load_tokenizer(model_dir: str | Path) -> Tokenizer | None:
    """The model folder's tokenizer, or None when it ships none."""
    if not (Path(model_dir) / "tokenizer.json").exists():
        return None
    from tt_serve.tokenizer import Tokenizer

    return Tokenizer.from_dir(model_dir)


class LLM:
    """Offline generation: ``LLM(model=DIR).generate(prompts, params)``.

    All prompts run concurrently through the engine (continuous batching, chunked prefill,
    prefix cache); outputs come back in prompt order.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        backend: str = "torch",
        device: str = "cpu",
        dtype: str = "float32",
        prefix_caching: bool = True,
        block_size: int = DEFAULT_BLOCK_SIZE,
        chunk: int = DEFAULT_CHUNK,
        kv_blocks: int | None = None,
        snapshot_slots: int | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_num_batched_tokens: int = 2048,
        max_model_len: int | None = None,
        mixed_steps: bool = True,
        traced: bool = False,
        device_resident: bool = False,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise TypeError(f"LLM() got unknown keyword(s): {', '.join(sorted(unknown))}")
        self.options = EngineOptions(
            model=str(model),
            backend=backend,
            device=device,
            dtype=dtype,
            prefix_caching=prefix_caching,
            block_size=block_size,
            chunk=chunk,
            kv_blocks=kv_blocks,
            snapshot_slots=snapshot_slots,
            max_batch=max_batch,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            mixed_steps=mixed_steps,
            traced=traced,
            device_resident=device_resident,
        )
        self.tokenizer = load_tokenizer(model)
        self.engine, self.spec = build_engine(self.options, tokenizer=self.tokenizer)
        self._ids = itertools.count()

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this model ships no tokenizer: pass token ids, not text")
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]] | str,
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str):
            prompts = [prompts]
        if params is None:
            params = SamplingParams()
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        encoded = [self.encode(p) for p in prompts]
        for ids, p in zip(encoded, plist, strict=True):
            self.engine.validate(ids, p)  # all or nothing: nothing is queued on a bad prompt
        rids = [f"llm-{next(self._ids)}" for _ in encoded]
        for rid, ids, p in zip(rids, encoded, plist, strict=True):
            self.engine.add_request(rid, ids, p)
        done: dict[str, RequestOutput] = {}
        try:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
        finally:
            for rid in rids:
                if rid not in done:
                    self.engine.abort(rid)
        return [done[rid] for rid in rids]
