"""One chat choice's generated text -> reasoning, content and tool calls, streamed or whole.

``ChatOutputParser`` chains the reasoning split and the tool-call parser over text deltas and
returns events; ``ChatMessage`` accumulates them into the non-streamed message. Both paths run
the same parser, so a stream's deltas reassemble to the whole response by construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tt_serve.agents.reasoning import Reasoning, ReasoningParser
from tt_serve.agents.tool_parser import Content, ToolCall, ToolCallParser

# Parsing needs the special tokens in the text (``skip_special_tokens=False``); the end-of-turn
# ones are not part of any field.
END_MARKERS = ("<|im_end|>", "<|endoftext|>")

ChatEvent = Reasoning | Content | ToolCall


@dataclass(frozen=True)
class OutputFormat:
    """How a request's output is read. ``tools`` None: no tool-call parsing."""

    reasoning: bool = False
    tools: Mapping[str, dict[str, Any]] | None = None
    parallel_tool_calls: bool = True
    named_tool: str | None = None  # tool_choice named this function (finish_reason "stop")
    tool_required: bool = False
    # The text keeps special tokens (vLLM's rule whenever tools are present, even under
    # tool_choice "none": <tool_call> is one); only the end-of-turn markers are dropped.
    keep_specials: bool = False

    @property
    def parses(self) -> bool:
        """Whether the text goes through the parser (else it is plain content)."""
        return self.reasoning or self.tools is not None or self.keep_specials


class ChatOutputParser:
    def __init__(self, fmt: OutputFormat) -> None:
        self.fmt = fmt
        self._reasoning = ReasoningParser(in_reasoning=fmt.reasoning)
        self._tools = (
            ToolCallParser(fmt.tools, parallel=fmt.parallel_tool_calls)
            if fmt.tools is not None
            else None
        )

    def feed(self, text: str) -> list[ChatEvent]:
        for marker in END_MARKERS:
            text = text.replace(marker, "")
        return self._route(self._reasoning.feed(text), final=False)

    def finish(self) -> list[ChatEvent]:
        return self._route(self._reasoning.finish(), final=True)

    def _route(self, items: list[Any], *, final: bool) -> list[ChatEvent]:
        out: list[ChatEvent] = []
        for item in items:
            if isinstance(item, Reasoning):
                out.append(item)
            elif self._tools is None:
                out.append(Content(item.text))
            else:
                out.extend(self._tools.feed(item.text))
        if final and self._tools is not None:
            out.extend(self._tools.finish())
        return out


@dataclass
class ChatMessage:
    """Events accumulated into one assistant message."""

    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)

    def add(self, events: list[ChatEvent]) -> None:
        for e in events:
            if isinstance(e, Reasoning):
                self.reasoning.append(e.text)
            elif isinstance(e, Content):
                self.content.append(e.text)
            else:
                self.calls.append(e)


def parse_whole(text: str, fmt: OutputFormat) -> ChatMessage:
    p = ChatOutputParser(fmt)
    msg = ChatMessage()
    msg.add(p.feed(text))
    msg.add(p.finish())
    return msg
