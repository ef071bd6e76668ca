"""One assistant turn, whichever API asked for it: the engine request, its output parsed once,
and the output as a sequence of items.

Chat completions, the Responses API and the Anthropic Messages API all translate their body into
one ``ChatCompletionRequest`` (``ServingChat.prompts`` renders, tokenizes and compiles the
grammar), run one engine request, and read its text through one ``ChatOutputParser``
(reasoning, content, tool calls). What differs is only the encoder: chat sends deltas of one
message, the other two send *items* (a reasoning item, a message, a function call; Anthropic's
content blocks), each opened, filled and closed before the next opens. ``Segments`` turns the
parser's events into that sequence, so the Responses and Messages encoders are small maps.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from tt_serve.agents.chat_output import ChatEvent, ChatMessage, ChatOutputParser, OutputFormat
from tt_serve.agents.reasoning import THINK_CLOSE, Reasoning
from tt_serve.agents.tool_parser import Content, ToolCall
from tt_serve.sequence import RequestOutput
from tt_serve.tokenizer import Tokenizer


class TurnEvents:
    """A turn's text as parser events, streamed (``feed`` each output) or whole."""

    def __init__(self, fmt: OutputFormat) -> None:
        self._parser = ChatOutputParser(fmt) if fmt.parses else None

    def feed(self, out: RequestOutput) -> list[ChatEvent]:
        """The events of one output's new text (the parser's tail too once it finished)."""
        if self._parser is None:
            return [Content(out.new_text)] if out.new_text else []
        events = self._parser.feed(out.new_text)
        if out.finished:
            events += self._parser.finish()
        return events

    def whole(self, text: str) -> ChatMessage:
        msg = ChatMessage()
        if self._parser is None:
            msg.content.append(text)
        else:
            msg.add(self._parser.feed(text))
            msg.add(self._parser.finish())
        return msg


class Kind(enum.Enum):
    REASONING = "reasoning"
    TEXT = "text"
    CALL = "call"


@dataclass(frozen=True)
class Opened:
    index: int
    kind: Kind
    call: ToolCall | None = None


@dataclass(frozen=True)
class Delta:
    index: int
    kind: Kind
    text: str  # reasoning or content text; a call's arguments JSON fragment


@dataclass(frozen=True)
class Closed:
    index: int
    kind: Kind
    text: str  # the item's whole text (a call: its arguments JSON)
    call: ToolCall | None = None


Segment = Opened | Delta | Closed


@dataclass
class Segments:
    """Parser events -> items, each opened, filled and closed before the next one opens.

    Consecutive events of one kind extend the open item; a tool call is one item of its own
    (opened with its name, its arguments as the fragments chat streams, closed). ``items`` holds
    every closed item, so the whole response is the stream's items by construction."""

    items: list[Closed] = field(default_factory=list)
    _kind: Kind | None = None
    _texts: list[str] = field(default_factory=list)

    def feed(self, events: list[ChatEvent]) -> list[Segment]:
        out: list[Segment] = []
        for e in events:
            if isinstance(e, ToolCall):
                out += self._close()
                i = len(self.items)
                out.append(Opened(i, Kind.CALL, e))
                out += [Delta(i, Kind.CALL, f) for f in e.argument_fragments()]
                closed = Closed(i, Kind.CALL, e.arguments_json, e)
                self.items.append(closed)
                out.append(closed)
                continue
            kind = Kind.REASONING if isinstance(e, Reasoning) else Kind.TEXT
            if not e.text:
                continue
            if kind != self._kind:
                out += self._close()
                self._kind = kind
                out.append(Opened(len(self.items), kind))
            self._texts.append(e.text)
            out.append(Delta(len(self.items), kind, e.text))
        return out

    def finish(self) -> list[Segment]:
        return self._close()

    def _close(self) -> list[Segment]:
        if self._kind is None:
            return []
        closed = Closed(len(self.items), self._kind, "".join(self._texts))
        self.items.append(closed)
        self._kind, self._texts = None, []
        return [closed]

    @property
    def called(self) -> bool:
        return any(c.kind == Kind.CALL for c in self.items)


def reasoning_tokens(out: RequestOutput, fmt: OutputFormat, tok: Tokenizer | None) -> int:
    """Output tokens spent thinking: those before ``</think>`` (all of them when it never came),
    when the turn started inside a think block."""
    if not fmt.reasoning or tok is None:
        return 0
    close = tok.token_to_id(THINK_CLOSE)
    ids = out.token_ids
    if close is not None and close in ids:
        return ids.index(close) + 1
    return len(ids)


async def read_whole(
    outputs: AsyncIterator[RequestOutput],
    reader: TurnReader,
    on_segment: Callable[[Segment], object],
) -> RequestOutput:
    """Read a non-streamed turn to its end, each segment to ``on_segment`` (an encoder keeps
    the items); the finished output."""
    final: RequestOutput | None = None
    async for out in outputs:
        for seg in reader.read(out):
            on_segment(seg)
        final = out if out.finished else final
    if final is None:
        raise RuntimeError("the turn's outputs ended before it finished")
    return final


class TurnReader:
    """One turn's outputs as segments; ``items`` are the closed ones (the whole response)."""

    def __init__(self, fmt: OutputFormat) -> None:
        self._events, self._segments = TurnEvents(fmt), Segments()

    def read(self, out: RequestOutput) -> list[Segment]:
        segs = self._segments.feed(self._events.feed(out))
        if out.finished:
            segs += self._segments.finish()
        return segs

    @property
    def items(self) -> list[Closed]:
        return self._segments.items

    @property
    def called(self) -> bool:
        return self._segments.called
