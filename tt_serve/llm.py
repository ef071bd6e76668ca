"""The offline API: ``LLM(model=DIR, **options).generate(prompts, params)``.

Options are ``ServeConfig`` fields (``tt_serve/config/serve_config.py`` holds their defaults);
the engine is built by ``engine/factory.py``, the same factory the HTTP server uses.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tt_serve.config.serve_config import ServeConfig
from tt_serve.engine.factory import build_engine
from tt_serve.model.spec import ModelSpec
from tt_serve.sequence import RequestError, RequestOutput, SamplingParams
from tt_serve.tokenizer import load_tokenizer


class LLM:
    """Offline generation: ``LLM(model=DIR).generate(prompts, params)``.

    All prompts run concurrently through the engine (continuous batching, chunked prefill,
    prefix cache); outputs come back in prompt order.
    """

    def __init__(self, model: str | Path, **options: Any) -> None:
        self.config = ServeConfig.from_kwargs("LLM()", model=str(model), **options)
        self.spec = ModelSpec.from_hf_dir(model)
        self.tokenizer = load_tokenizer(model)
        self.engine = build_engine(self.config, spec=self.spec, tokenizer=self.tokenizer)
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
