"""Per-request text streams: incremental detokenization followed by stop-string matching."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tt_serve.engine.engine import TextStream, TextStreamFactory
from tt_serve.sequence import SamplingParams

if TYPE_CHECKING:
    from tt_serve.tokenizer import IncrementalDetokenizer, StopMatcher, Tokenizer


class _DetokStream:
    def __init__(self, detok: IncrementalDetokenizer, stops: StopMatcher | None) -> None:
        self._detok = detok
        self._stops = stops

    def push(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        delta = self._detok.add(list(token_ids))
        if self._stops is None:
            return delta, False
        return self._stops.feed(delta)

    def flush(self) -> str:
        tail = self._detok.finish()
        if self._stops is None:
            return tail
        text, stopped = self._stops.feed(tail)
        return text if stopped else text + self._stops.finish()


def text_stream_factory(tokenizer: Tokenizer) -> TextStreamFactory:
    from tt_serve.tokenizer import StopMatcher

    def make(params: SamplingParams) -> TextStream:
        stops = StopMatcher(params.stop_strings) if params.stop_strings else None
        return _DetokStream(tokenizer.incremental_detokenizer(params.skip_special_tokens), stops)

    return make
