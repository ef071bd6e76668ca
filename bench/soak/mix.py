"""The soak's request mix: item ``i`` of a seed is drawn from its own ``Random``, so the items a
seed gives are the same whatever the concurrency and however the workers interleave.

An item is one unit of client work. A conversation is several requests in order (each turn
re-sends the history, or on the Responses API continues from ``previous_response_id``, and
appends a new user message); every other kind is one request. Greedy items (conversations,
completions, full streams) are the ones a cache-off control server must answer identically.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from bench.load.workloads import token_range

WEIGHTS = {
    "conversation": 30,
    "completion": 18,
    "stream": 14,
    "dropped_stream": 8,
    "timeout": 6,
    "bad_input": 14,
    "oversized": 10,
}
"""Relative frequency of each kind of item."""

APIS = ("chat", "responses", "messages")
PATHS = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
HEADS = 4
"""Shared token-id heads and system prompts: requests on the same head hit (and evict) each other."""
HEAD_TOKENS = 384
UNKNOWN_MODEL = "no-such-model"
_SYLLABLES = ("ka", "lo", "mi", "tur", "sen", "dra", "vel", "no", "pi", "qua", "rez", "tho", "ban")


@dataclass(frozen=True)
class Conversation:
    """An agent conversation on one API: a system prompt shared with other conversations, then
    one user message per turn."""

    api: str
    system: str
    users: tuple[str, ...]
    max_tokens: int


@dataclass(frozen=True)
class Single:
    """One request. ``body`` is JSON to send, ``raw`` bytes sent as they are (malformed JSON).
    ``expect`` is the status the server must answer; ``error_names``: text its error message must
    contain (the context limit)."""

    path: str
    body: dict[str, Any] | None = None
    raw: bytes | None = None
    expect: int = 200
    error_names: str | None = None
    drop_after: int = 0
    """Streams the client closes after this many chunks (0: read to the end)."""
    timeout_s: float | None = None
    """A client timeout that aborts the request (it may also finish in time)."""


@dataclass(frozen=True)
class Item:
    index: int
    kind: str
    conversation: Conversation | None = None
    single: Single | None = None

    @property
    def greedy(self) -> bool:
        """Whether its answers are deterministic, so a control server must repeat them."""
        return self.kind in ("conversation", "completion", "stream")


@dataclass(frozen=True)
class Mix:
    """The items of one seed, for a server with context ``max_model_len`` serving ``model``."""

    seed: int
    max_model_len: int
    model: str
    """The served model name (the Messages API requires it)."""
    vocab: int = 0
    heads: list[list[int]] = field(init=False)
    systems: list[str] = field(init=False)

    def __post_init__(self) -> None:
        rng = random.Random(f"soak-heads|{self.seed}")
        lo, hi = token_range(self.vocab)
        heads = [[rng.randrange(lo, hi) for _ in range(HEAD_TOKENS)] for _ in range(HEADS)]
        systems = [words(rng, rng.randrange(120, 360)) for _ in range(HEADS)]
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "systems", systems)

    def item(self, index: int) -> Item:
        rng = random.Random(f"soak|{self.seed}|{index}")
        kind = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        if kind == "conversation":
            users = tuple(words(rng, rng.randrange(10, 60)) for _ in range(rng.randrange(2, 5)))
            convo = Conversation(
                rng.choice(APIS), rng.choice(self.systems), users, rng.randrange(8, 17)
            )
            return Item(index, kind, conversation=convo)
        return Item(index, kind, single=getattr(self, f"_{kind}")(rng))

    def drain_stream(self, k: int) -> Item:
        """The ``k``-th stream of the drain phase: long enough to be in flight at SIGTERM."""
        rng = random.Random(f"soak-drain|{self.seed}|{k}")
        body = self._greedy_body(rng, 32)
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        return Item(-1 - k, "stream", single=Single(PATHS["completions"], body))

    def _prompt(self, rng: random.Random) -> list[int]:
        lo, hi = token_range(self.vocab)
        tail = [rng.randrange(lo, hi) for _ in range(rng.randrange(8, 200))]
        return (rng.choice(self.heads) if rng.random() < 0.75 else []) + tail

    def _greedy_body(self, rng: random.Random, max_tokens: int) -> dict[str, Any]:
        return {
            "prompt": self._prompt(rng),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }

    def _completion(self, rng: random.Random) -> Single:
        return Single(PATHS["completions"], self._greedy_body(rng, rng.randrange(8, 17)))

    def _stream(self, rng: random.Random) -> Single:
        body = self._greedy_body(rng, rng.randrange(8, 17))
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        return Single(PATHS["completions"], body)

    def _dropped_stream(self, rng: random.Random) -> Single:
        if rng.random() < 0.5:
            body = self._greedy_body(rng, 32) | {"stream": True}
            return Single(PATHS["completions"], body, drop_after=rng.randrange(1, 3))
        body = {
            "messages": [{"role": "user", "content": words(rng, rng.randrange(10, 40))}],
            "max_tokens": 32,
            "temperature": 0.0,
            "stream": True,
        }
        return Single(PATHS["chat"], body, drop_after=rng.randrange(1, 3))

    def _timeout(self, rng: random.Random) -> Single:
        body = self._greedy_body(rng, 48)
        return Single(PATHS["completions"], body, timeout_s=rng.uniform(0.1, 0.4))

    def _bad_input(self, rng: random.Random) -> Single:
        api = rng.choice(list(PATHS))
        good = self._good_body(rng, api)
        case = rng.choice(("malformed", "wrong_type", "unknown_model"))
        if case == "malformed":
            text = json.dumps(good)
            return Single(
                PATHS[api], raw=text[: rng.randrange(1, len(text) - 1)].encode(), expect=400
            )
        if case == "unknown_model":  # OpenAI and Anthropic answer an unknown model with 404
            return Single(PATHS[api], good | {"model": UNKNOWN_MODEL}, expect=404)
        wrong = {
            "completions": {"max_tokens": "many"},
            "chat": {"messages": "not a list"},
            "responses": {"input": 42},
            "messages": {"max_tokens": [16]},
        }[api]
        return Single(PATHS[api], good | wrong, expect=400)

    def _oversized(self, rng: random.Random) -> Single:
        lo, hi = token_range(self.vocab)
        case = rng.choice(("prompt_ids", "max_tokens", "chat", "messages"))
        if case == "prompt_ids":
            n = self.max_model_len + rng.randrange(1, 256)
            body = {"prompt": [rng.randrange(lo, hi) for _ in range(n)], "max_tokens": 4}
            return Single(
                PATHS["completions"], body, expect=400, error_names=str(self.max_model_len)
            )
        if case == "max_tokens":
            body = self._greedy_body(rng, self.max_model_len)
            return Single(
                PATHS["completions"], body, expect=400, error_names=str(self.max_model_len)
            )
        # Pseudo-words are at least one token each: twice the context in words is past it.
        long = words(rng, 2 * self.max_model_len)
        body = self._good_body(rng, case) | {"messages": [{"role": "user", "content": long}]}
        return Single(PATHS[case], body, expect=400, error_names=str(self.max_model_len))

    def _good_body(self, rng: random.Random, api: str) -> dict[str, Any]:
        """A small valid greedy body of ``api`` (the base the bad inputs break)."""
        text = words(rng, rng.randrange(5, 20))
        base: dict[str, Any] = {"temperature": 0.0, "ignore_eos": True}
        if api == "completions":
            return base | {"prompt": text, "max_tokens": 8}
        if api == "responses":
            return base | {"input": text, "max_output_tokens": 8}
        body = base | {"messages": [{"role": "user", "content": text}], "max_tokens": 8}
        return (body | {"model": self.model}) if api == "messages" else body


def words(rng: random.Random, n: int) -> str:
    """``n`` pseudo-words of one to three syllables."""
    return " ".join(
        "".join(rng.choice(_SYLLABLES) for _ in range(rng.randrange(1, 4))) for _ in range(n)
    )
