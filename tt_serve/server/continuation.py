"""Exact continuation of a stored turn: the previous prompt and output ids as they were, then the
new messages rendered as the chat template renders what follows a finished assistant turn.

Re-rendering a conversation from its messages need not give back the tokens the model saw: the
model's own output may tokenize otherwise when re-encoded, and Qwen3.5's template drops the
reasoning of every assistant turn before the last user message. A continuation keeps the ids,
so the next turn's prompt starts with the previous turn's whole prompt and output, reasoning
included (docs/agents.md, "Resuming exactly").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tt_serve.tokenizer import Tokenizer

TURN_END = "<|im_end|>"
# Stand-ins for the turn before the new messages: text no conversation holds.
_PREV_USER = "\u2063tt-serve previous user turn\u2063"
_PREV_ANSWER = "\u2063tt-serve previous assistant turn\u2063"


def next_turn_text(
    tok: Tokenizer,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    **kwargs: Any,
) -> str:
    """How the template renders ``messages`` after a finished assistant turn (from the newline
    after its ``<|im_end|>``), the generation prompt included.

    The template renders a stand-in user turn and answer followed by ``messages``; the text after
    the stand-in answer's end is what a real conversation would get there. Raises
    ``ValueError`` when the template renders no such turn end (then there is no exact place to
    continue from)."""
    if not messages:
        raise ValueError("a continuation needs at least one new input item")
    head = [{"role": "user", "content": _PREV_USER}, {"role": "assistant", "content": _PREV_ANSWER}]
    text = tok.apply_chat_template(
        head + messages, add_generation_prompt=add_generation_prompt, **kwargs
    )
    at = text.find(_PREV_ANSWER)
    end = text.find(TURN_END, at) if at >= 0 else -1
    if end < 0:
        raise ValueError(
            f"the chat template does not end an assistant turn with {TURN_END}: "
            "this model cannot continue a stored response exactly"
        )
    return text[end + len(TURN_END) :]


def closed_turn(
    prompt_ids: Sequence[int], output_ids: Sequence[int], tok: Tokenizer, eos_ids: frozenset[int]
) -> list[int] | None:
    """The ids of a finished turn as the next prompt starts: the prompt, the output, and the
    turn's end token (kept when the model wrote it, put in place of another end-of-sequence
    token or after a cut-off output). None when the vocabulary has no turn end token."""
    end = tok.token_to_id(TURN_END)
    if end is None:
        return None
    out = list(output_ids)
    if out and out[-1] != end and out[-1] in eos_ids:
        out.pop()
    if not out or out[-1] != end:
        out.append(end)
    return [*prompt_ids, *out]
