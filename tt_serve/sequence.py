"""Requests, sampling parameters and outputs: plain data shared by the engine, the LLM API and
the HTTP server. Standard library only."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from tt_serve.cache.resume import ResumePoints


class RequestError(ValueError):
    """A request that can never be served as asked. The message names the violated limit."""


class GrammarMatcher(Protocol):
    """One request's position in a compiled grammar (``tt_serve/agents/grammar.py``)."""

    def fill_bitmask(self, out: np.ndarray) -> None:
        """Write the allowed next tokens into ``out``: int32 words, bit ``i % 32`` of word
        ``i // 32`` set when token ``i`` is allowed (the xgrammar / llguidance layout)."""
        ...

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False when the grammar rejects it."""
        ...

    def error(self) -> str | None:
        """Why the matcher cannot go on, or None while it can."""
        ...


class Grammar(Protocol):
    """A grammar compiled once (per schema) and shared by every request that uses it."""

    def matcher(self) -> GrammarMatcher:
        """A fresh matcher at the grammar's start, owned by one request."""
        ...


MIN_TEMPERATURE = 1e-5
"""Below this the scaled logits overflow float64; sampling is then greedy in all but name."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop. Greedy when ``temperature == 0``."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] | list[str] | str | None = None
    stop_token_ids: tuple[int, ...] | list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    skip_special_tokens: bool = True
    # Constrained decoding: every token is drawn from what ``grammar`` allows (the bitmask is
    # applied to the logits on the host). With ``grammar_after_token`` set, the constraint
    # starts only after that token was generated (``</think>``: the end of reasoning).
    grammar: Grammar | None = None
    grammar_after_token: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def argmax(self) -> bool:
        """The token is the argmax (greedy, or a temperature too small to draw with)."""
        return self.greedy or self.temperature < MIN_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        if isinstance(self.stop, str):
            return (self.stop,)
        return tuple(self.stop)

    def validate(self) -> None:
        """Raise RequestError naming the first invalid field."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RequestError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= 100.0:
            raise RequestError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise RequestError(f"min_p must be in [0, 1], got {self.min_p}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise RequestError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise RequestError(
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"
            )
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise RequestError(
                f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}"
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise RequestError(f"logprobs must be in [0, 20], got {self.logprobs}")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise RequestError(
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}"
            )
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise RequestError(f"seed must be in [0, 2**63), got {self.seed}")
        if any(not s for s in self.stop_strings):
            raise RequestError("stop strings must be non-empty")
        if self.stop_token_ids is not None and any(
            not isinstance(t, int) or t < 0 for t in self.stop_token_ids
        ):
            raise RequestError("stop_token_ids must be non-negative integers")


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass
class RequestOutput:
    """A request's state as reported to callers (cumulative; ``new_*`` hold this step's delta)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str | None = None
    finish_reason: str | None = None
    cached_tokens: int = 0
    logprobs: list[dict[int, float]] | None = None
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    error: str | None = None
    bad_request: bool = False  # the error is the request's own (HTTP 400), not a server fault
    picked_on_device: int = 0  # output tokens the backend picked (argmax or a device draw)
    picked_on_host: int = 0  # output tokens sampled on the host from the logits
    # Server-side timing (monotonic seconds), for metrics.
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestStatus(enum.StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """The engine's view of one request. Mutated only by the scheduler."""

    request_id: str
    seq_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = 0.0
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[dict[int, float]] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed: int = 0  # leading tokens whose KV / GDN state are computed
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    block_table: tuple[int, ...] = ()
    state_slot: int = -1
    finish_reason: FinishReason | None = None
    error: str | None = None
    bad_request: bool = False  # the error is the request's own, not a server fault
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    grammar_open: bool = False  # the grammar constrains the next token (see SamplingParams)
    picked_on_device: int = 0  # tokens the backend picked (argmax or a device draw)
    picked_on_host: int = 0  # tokens the engine picked from the logits
    resume: ResumePoints | None = None  # where the prompt is cut (set when scheduled)
    # The prompt's block hashes as far as admission looked (kept while it waits: a 128k-token
    # prompt retried every step is hashed once).
    block_hashes: list[bytes] = field(default_factory=list)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= self.prompt_len

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
