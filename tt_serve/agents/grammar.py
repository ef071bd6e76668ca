"""Grammars for constrained decoding, on llguidance (pinned in pyproject.toml; the choice is
recorded in docs/structured-output.md).

``GrammarCompiler`` turns a request's constraint (a JSON schema, or the Qwen tool-call format
for ``tool_choice`` required / named) into a ``CompiledGrammar``, once per distinct grammar: an
LRU cache keyed by the grammar text holds the compiled matcher, and each request gets a cheap
copy of it (``matcher()``). A schema llguidance cannot compile raises ``GrammarError`` with its
message, which the server answers as a 400.

JSON is compiled with fixed separators (``", "``, ``": "``, no free whitespace), so a weak or
random model cannot loop on whitespace. ``reasoning=True`` lets up to two newlines precede the
constrained text: the model writes them after ``</think>``, where the constraint begins.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import llguidance
import numpy as np

from tt_serve.tokenizer import Tokenizer

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_SIZE = 256
_PREFIX = r"/\n{0,2}/"


class GrammarError(ValueError):
    """A schema or grammar that cannot be compiled; the message names the problem."""


class LLGuidanceMatcher:
    """``GrammarMatcher`` (``tt_serve/sequence.py``) over an ``llguidance.LLMatcher``."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._m = matcher

    def fill_bitmask(self, out: np.ndarray) -> None:
        assert out.dtype == np.int32 and out.flags["C_CONTIGUOUS"]
        self._m.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def accept(self, token_id: int) -> bool:
        return bool(self._m.consume_token(token_id))

    def error(self) -> str | None:
        return _short(self._m.get_error()) if self._m.is_error() else None

    def is_stopped(self) -> bool:
        return bool(self._m.is_stopped())


class CompiledGrammar:
    """``Grammar`` (``tt_serve/sequence.py``): a compiled matcher at its start, copied per use."""

    def __init__(self, source: str, template: llguidance.LLMatcher) -> None:
        self.source = source
        self._template = template

    def matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._template.deep_copy())


def _json_rule(schema: dict[str, Any]) -> str:
    """A Lark ``%json`` body for ``schema`` with the fixed separators."""
    extra = schema.get("x-guidance") or {}
    if not isinstance(extra, dict):
        raise GrammarError("x-guidance must be an object")
    opts = {**JSON_OPTIONS, **extra}
    return "%json " + json.dumps({**schema, "x-guidance": opts}, ensure_ascii=False)


def json_schema_lark(schema: dict[str, Any], *, reasoning: bool = False) -> str:
    start = f"start: PRE j\nPRE: {_PREFIX}" if reasoning else "start: j"
    return f"{start}\nj: {_json_rule(schema)}\n"


class GrammarCompiler:
    """Compiles and caches grammars for one tokenizer and the model's vocabulary size (the
    logits' width, which may exceed the tokenizer's ids: the padding ids are never allowed)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        # Building the token trie over a 248k vocabulary takes seconds: once per compiler.
        self._tok = llguidance.LLTokenizer(
            tokenizer.to_json(), n_vocab=vocab_size, eos_token=sorted(eos_token_ids)
        )
        self.vocab_size = vocab_size
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # grammars compiled (cache misses)

    def json_schema(self, schema: dict[str, Any], *, reasoning: bool = False) -> CompiledGrammar:
        if not isinstance(schema, dict):
            raise GrammarError("the JSON schema must be an object")
        return self.lark(json_schema_lark(schema, reasoning=reasoning))

    def lark(self, source: str) -> CompiledGrammar:
        with self._lock:
            hit = self._cache.get(source)
            if hit is not None:
                self._cache.move_to_end(source)
                return hit
        try:
            grammar = llguidance.LLMatcher.grammar_from_lark(source)
            template = llguidance.LLMatcher(self._tok, grammar, log_level=0)
        except (ValueError, TypeError) as exc:
            raise GrammarError(_short(str(exc))) from exc
        if template.is_error():
            raise GrammarError(_short(template.get_error()))
        compiled = CompiledGrammar(source, template)
        with self._lock:
            self._cache[source] = compiled
            self.compiled += 1
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled


def _short(message: str) -> str:
    # llguidance appends its parser state, the whole grammar or (on a panic) a backtrace; the
    # first line names the fault.
    for marker in ("\n<state>", "\n<grammar>", "\n<backtrace>"):
        message = message.split(marker)[0]
    return message.strip()


_compilers: dict[int, tuple[Tokenizer, GrammarCompiler]] = {}
_compilers_lock = threading.Lock()


def compiler_for(
    tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Iterable[int]
) -> GrammarCompiler:
    """The process's compiler for this tokenizer (built on first use)."""
    key = id(tokenizer)
    with _compilers_lock:
        got = _compilers.get(key)
        if got is None or got[0] is not tokenizer or got[1].vocab_size != vocab_size:
            got = (tokenizer, GrammarCompiler(tokenizer, vocab_size, eos_token_ids))
            _compilers[key] = got
        return got[1]
