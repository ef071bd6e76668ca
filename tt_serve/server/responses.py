"""OpenAI response pieces: the envelope every body and chunk shares, completion and chat choices
(whole, or the delta of one engine output), logprobs and usage. Pure functions of outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from tt_serve.agents.chat_output import OutputFormat
from tt_serve.agents.reasoning import Reasoning
from tt_serve.agents.tool_parser import Content, ToolCall, new_call_id
from tt_serve.sequence import RequestOutput
from tt_serve.server.protocol import usage
from tt_serve.server.turn import TurnEvents
from tt_serve.tokenizer import Tokenizer

Choice = dict[str, Any]


class ChoiceBuilder(Protocol):
    """One choice of one reply, from its engine outputs (it may keep a stream's state)."""

    def whole(self, out: RequestOutput) -> Choice:
        """The whole choice from the finished output."""
        ...

    def deltas(self, out: RequestOutput) -> list[Choice]:
        """The stream chunks' choices for one output (new tokens and text)."""
        ...


class CompletionChoiceBuilder:
    def __init__(self, index: int, tok: Tokenizer | None, prefix: str, token_ids: bool) -> None:
        self.index, self.tok, self.prefix, self.token_ids = index, tok, prefix, token_ids

    def whole(self, out: RequestOutput) -> Choice:
        return completion_choice(self.index, out, self.tok, self.prefix, self.token_ids)

    def deltas(self, out: RequestOutput) -> list[Choice]:
        return [completion_delta(self.index, out, self.tok, self.token_ids)]


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


def _finish_reason(reason: str | None, fmt: OutputFormat, called: bool) -> str | None:
    """OpenAI's: ``tool_calls`` when the model stopped after calling (auto or required); a
    named tool_choice reports ``stop``; ``length`` always wins (a call may be cut off)."""
    if reason == "stop" and called and fmt.named_tool is None:
        return "tool_calls"
    return reason


class ChatChoiceBuilder:
    """One chat choice of one reply: reasoning, content and tool calls parsed from the text
    (``OutputFormat``), whole or as stream deltas. Holds the stream's parser state."""

    def __init__(
        self, index: int, tok: Tokenizer | None, k: int, token_ids: bool, fmt: OutputFormat
    ) -> None:
        self.index, self.tok, self.k, self.token_ids, self.fmt = index, tok, k, token_ids, fmt
        self._events = TurnEvents(fmt)
        self._num_calls = 0

    def whole(self, out: RequestOutput) -> Choice:
        msg = self._events.whole(out.text or "")
        content = "".join(msg.content)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if msg.calls and not content else content,
        }
        if self.fmt.reasoning:
            message["reasoning_content"] = "".join(msg.reasoning) or None
        if msg.calls:
            message["tool_calls"] = [_tool_call(c) for c in msg.calls]
        choice: Choice = {
            "index": self.index,
            "message": message,
            "logprobs": chat_logprobs(out.token_ids, out.logprobs, self.tok, self.k),
            "finish_reason": _finish_reason(out.finish_reason, self.fmt, bool(msg.calls)),
        }
        if self.token_ids:
            choice["token_ids"] = list(out.token_ids)
            choice["prompt_token_ids"] = list(out.prompt_token_ids)
        return choice

    def deltas(self, out: RequestOutput) -> list[Choice]:
        """The chunks' choices for one output: a call is sent as its name (arguments "")
        followed by argument fragments, as OpenAI streams them."""
        events = self._events.feed(out)
        pieces: list[dict[str, Any]] = []
        for e in events:
            if isinstance(e, Reasoning):
                pieces.append({"reasoning_content": e.text})
            elif isinstance(e, Content):
                pieces.append({"content": e.text})
            else:
                pieces += self._call_deltas(e)
        if not pieces:
            pieces.append({})
        lps = chat_logprobs(out.new_token_ids, new_logprobs(out), self.tok, self.k)
        choices: list[Choice] = []
        for n, delta in enumerate(pieces):
            last = n == len(pieces) - 1
            choice: Choice = {
                "index": self.index,
                "delta": delta,
                "logprobs": lps if n == 0 else None,
                "finish_reason": _finish_reason(out.finish_reason, self.fmt, self._num_calls > 0)
                if last
                else None,
            }
            if self.token_ids:
                choice["token_ids"] = list(out.new_token_ids) if n == 0 else []
            choices.append(choice)
        return choices

    def _call_deltas(self, call: ToolCall) -> list[dict[str, Any]]:
        i = self._num_calls
        self._num_calls += 1
        head = {
            "index": i,
            "id": new_call_id(),
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        frags = [{"index": i, "function": {"arguments": f}} for f in call.argument_fragments()]
        return [{"tool_calls": [d]} for d in [head, *frags]]


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": new_call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json},
    }


def chat_role(index: int) -> Choice:
    """The first chunk of each streamed chat choice."""
    return {
        "index": index,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
