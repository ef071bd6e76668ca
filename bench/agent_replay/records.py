"""One request of the replay as measured, whichever way it was driven (HTTP or in-process)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TurnRecord:
    agent: int
    turn: int
    """1-based: turn 1 is the agent's first request (system + task)."""
    rendered_tokens: int
    """The prompt as the client renders it with the model's chat template (a check that the
    server rendered the same: it should equal ``prompt_tokens``)."""
    resumable: int | None = None
    """Longest common prefix of this prompt with the previous turn's prompt + its generated ids:
    how far a cache that kept the whole previous sequence could resume (None on turn 1, or when
    the server does not return generated ids)."""
    answer_start: int | None = None
    """Where the previous answer's message starts in this prompt (its ``<|im_start|>``)."""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    server_computed: int | None = None
    """Prompt tokens the server says it evaluated, where it says (llama-server ``prompt_n``)."""
    rerender_changed: bool | None = None
    """Whether re-rendering changed the previous answer's text (``rerendered`` mode only)."""
    start: float = 0.0
    """Seconds after the run started."""
    ttft: float | None = None
    e2el: float | None = None
    added: int | None = None
    """prompt_tokens - the same agent's previous prompt_tokens (None on turn 1)."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.prompt_tokens is not None

    @property
    def computed(self) -> int | None:
        """Prompt tokens the server computed: prompt - cached."""
        if self.prompt_tokens is None or self.cached_tokens is None:
            return None
        return self.prompt_tokens - self.cached_tokens
