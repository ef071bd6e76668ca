"""OpenAI response pieces: the envelope every body and chunk shares, completion and chat choices
(whole, or the delta of one engine output), logprobs and usage. Pure functions of outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tt_serve.sequence import RequestOutput
from tt_serve.server.protocol import usage
from tt_serve.tokenizer import Tokenizer

Choice = dict[str, Any]


@dataclass(frozen=True)
class Envelope:
    """What every body and chunk of one reply repeats."""

    id: str
    object: str
    created: int
    model: str

    def wrap(self, choices: list[Choice], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return body


def new_logprobs(out: RequestOutput) -> list[dict[int, float]] | None:
    """The logprobs of this output's new tokens (``out.logprobs`` is cumulative)."""
    if out.logprobs is None:
        return None
    return out.logprobs[len(out.token_ids) - len(out.new_token_ids) :]


def usage_of(
    prompts: list[list[int]], prompt_index: list[int], finals: list[RequestOutput]
) -> dict[str, Any]:
    """Usage over finished outputs; a prompt's cached tokens count once however many choices."""
    cached: dict[int, int] = {}
    for i, out in zip(prompt_index, finals, strict=True):
        cached.setdefault(i, out.cached_tokens)
    return usage(
        sum(len(p) for p in prompts), sum(len(o.token_ids) for o in finals), sum(cached.values())
    )


def _token_text(tok: Tokenizer | None, t: int) -> str:
    return tok.decode([t], skip_special_tokens=False) if tok is not None else str(t)


# -- completions -------------------------------------------------------------------------------


def completion_logprobs(
    token_ids: list[int],
    logprobs: list[dict[int, float]] | None,
    tok: Tokenizer | None,
    offset: int,
) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    tokens, token_lps, tops, offsets = [], [], [], []
    pos = offset
    for t, d in zip(token_ids, logprobs, strict=False):
        s = _token_text(tok, t)
        tokens.append(s)
        token_lps.append(d.get(t))
        tops.append({_token_text(tok, k): v for k, v in d.items()})
        offsets.append(pos)
        pos += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": token_lps,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def completion_choice(
    index: int, out: RequestOutput, tok: Tokenizer | None, prefix: str, token_ids: bool
) -> Choice:
    choice: Choice = {
        "index": index,
        "text": prefix + (out.text or ""),
        "logprobs": completion_logprobs(out.token_ids, out.logprobs, tok, len(prefix)),
        "finish_reason": out.finish_reason,
    }
    if token_ids:
        choice["token_ids"] = list(out.token_ids)
        choice["prompt_token_ids"] = list(out.prompt_token_ids)
    return choice


def completion_delta(
    index: int, out: RequestOutput, tok: Tokenizer | None, token_ids: bool
) -> Choice:
    choice: Choice = {
        "index": index,
        "text": out.new_text,
        "logprobs": completion_logprobs(out.new_token_ids, new_logprobs(out), tok, 0),
        "finish_reason": out.finish_reason,
    }
    if token_ids:
        choice["token_ids"] = list(out.new_token_ids)
    return choice


# -- chat --------------------------------------------------------------------------------------


def chat_logprobs(
    token_ids: list[int], logprobs: list[dict[int, float]] | None, tok: Tokenizer | None, k: int
) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    content = []
    for t, d in zip(token_ids, logprobs, strict=False):
        s = _token_text(tok, t)
        tops = sorted(((v, kk) for kk, v in d.items()), reverse=True)[:k]
        content.append(
            {
                "token": s,
                "logprob": d.get(t),
                "bytes": list(s.encode()),
                "top_logprobs": [
                    {
                        "token": _token_text(tok, kk),
                        "logprob": v,
                        "bytes": list(_token_text(tok, kk).encode()),
                    }
                    for v, kk in tops
                ],
            }
        )
    return {"content": content}


def chat_choice(
    index: int, out: RequestOutput, tok: Tokenizer | None, k: int, token_ids: bool
) -> Choice:
    choice: Choice = {
        "index": index,
        "message": {"role": "assistant", "content": out.text or ""},
        "logprobs": chat_logprobs(out.token_ids, out.logprobs, tok, k),
        "finish_reason": out.finish_reason,
    }
    if token_ids:
        choice["token_ids"] = list(out.token_ids)
        choice["prompt_token_ids"] = list(out.prompt_token_ids)
    return choice


def chat_delta(
    index: int, out: RequestOutput, tok: Tokenizer | None, k: int, token_ids: bool
) -> Choice:
    choice: Choice = {
        "index": index,
        "delta": {"content": out.new_text} if out.new_text else {},
        "logprobs": chat_logprobs(out.new_token_ids, new_logprobs(out), tok, k),
        "finish_reason": out.finish_reason,
    }
    if token_ids:
        choice["token_ids"] = list(out.new_token_ids)
    return choice


def chat_role(index: int) -> Choice:
    """The first chunk of each streamed chat choice."""
    return {
        "index": index,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
