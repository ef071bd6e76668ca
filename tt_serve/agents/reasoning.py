"""``<think>…</think>`` in the model's text, split into reasoning and content.

Qwen3.5 / 3.6 templates open the think block in the prompt (``<|im_start|>assistant\n<think>\n``)
when thinking is on, so whether the output starts inside reasoning is read from the rendered
prompt (``prompt_opens_reasoning``), not from a per-checkpoint default. The model then writes
the reasoning, ``\n</think>\n\n`` and the answer. Without a ``</think>`` the whole output is
reasoning (cut off while thinking).
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_CLOSE = "\n" + THINK_CLOSE  # the newline before </think> is framing, not reasoning


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether the last turn of a rendered prompt leaves a ``<think>`` block open."""
    tail = prompt[prompt.rfind("<|im_start|>") :] if "<|im_start|>" in prompt else prompt
    return tail.rfind(THINK_OPEN) > tail.rfind(THINK_CLOSE)


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class Text:
    text: str


ReasoningEvent = Reasoning | Text


class ReasoningParser:
    """Incremental: reasoning until ``</think>``, then text (leading newlines dropped)."""

    def __init__(self, *, in_reasoning: bool) -> None:
        self.in_reasoning = in_reasoning
        self._buf = ""
        self._after_close = False

    def feed(self, text: str) -> list[ReasoningEvent]:
        out: list[ReasoningEvent] = []
        if self.in_reasoning:
            self._buf += text
            i = self._buf.find(THINK_CLOSE)
            if i < 0:
                keep = max(_partial(self._buf, _CLOSE), _partial(self._buf, THINK_CLOSE))
                head, self._buf = (
                    self._buf[: len(self._buf) - keep],
                    self._buf[len(self._buf) - keep :],
                )
                if head:
                    out.append(Reasoning(head))
                return out
            head = self._buf[:i].removesuffix("\n")
            if head:
                out.append(Reasoning(head))
            text, self._buf = self._buf[i + len(THINK_CLOSE) :], ""
            self.in_reasoning, self._after_close = False, True
        if self._after_close:
            text = text.lstrip("\n")
            if not text:
                return out
            self._after_close = False
        if text:
            out.append(Text(text))
        return out

    def finish(self) -> list[ReasoningEvent]:
        buf, self._buf = self._buf, ""
        if buf and self.in_reasoning:
            return [Reasoning(buf)]
        return []


def _partial(text: str, marker: str) -> int:
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
