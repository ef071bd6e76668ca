"""From a validated body to engine requests.

One HTTP request becomes one job per (prompt, choice). ``submit`` hands all of them to the async
engine at once, which validates each (400) and gives them their queue slots (503) before
anything is queued, so a refused request leaves nothing behind and an accepted one holds its
slots before any response header is sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tt_serve.engine.async_engine import AsyncEngine, NewRequest, OutputStream, QueueFullError
from tt_serve.sequence import RequestError
from tt_serve.server.protocol import APIError, SamplingRequest, new_id, unavailable
from tt_serve.tokenizer import Tokenizer


@dataclass(frozen=True)
class Job:
    """One engine request of an HTTP request; its choice index is its place in the job list."""

    prompt_index: int
    request: NewRequest


def encode_prompts(prompt: Any, tok: Tokenizer | None) -> list[list[int]]:
    """The token ids of each prompt of a validated ``CompletionRequest.prompt``.

    Validation made the prompt one member of its union, each a homogeneous list: a str, a list
    of ids, of strs, or of id lists. So the first element tells a list's kind, and id lists
    are already lists of ints (strict mode: no bools, no floats), copied as they are: a
    4,160-id prompt in 5 us instead of 0.4 ms of per-id checks and conversions."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and type(prompt[0]) is int:
        items = [prompt]
    else:
        items = list(prompt)
    if not items:
        raise APIError(400, "prompt must not be empty", param="prompt")
    out: list[list[int]] = []
    for p in items:
        if isinstance(p, str):
            if tok is None:
                raise APIError(400, "this model ships no tokenizer: send token ids", param="prompt")
            out.append(tok.encode(p))
        else:
            out.append(list(p))
    return out


def make_jobs(
    body: SamplingRequest, prompts: list[list[int]], max_tokens: int, logprobs: int | None
) -> list[Job]:
    return [
        Job(
            i,
            NewRequest(new_id("req"), p, body.sampling_params(max_tokens, logprobs, seed_offset=c)),
        )
        for i, p in enumerate(prompts)
        for c in range(body.n)
    ]


def submit(engine: AsyncEngine, jobs: list[Job]) -> OutputStream:
    try:
        return engine.submit([j.request for j in jobs])
    except QueueFullError as exc:
        raise unavailable(str(exc), code="queue_full") from exc
    except RequestError as exc:
        msg = str(exc)
        raise APIError(
            400,
            msg,
            param="prompt" if "prompt" in msg else None,
            code="context_length_exceeded" if "context" in msg else None,
        ) from exc
