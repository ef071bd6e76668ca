"""Resume points: where a prompt's prefill is cut, and where a prefix-cache hit may resume.

A hit at b restores a GDN snapshot taken after b tokens and reuses the KV of [0, b). It gives
exactly the cold run's bits only if the cold run also computed [0, b) in the same chunks and cut
at b (the chunks after b are then the same too). Rather than make every kernel independent of
where a step is cut, every run -- cold or warm, cache on or off -- cuts a prompt at the same
places, chosen from the prompt's own tokens:

* ``chunk``: every multiple of the prefill chunk C (today's rule, and the whole rule under
  ``ResumeRule(messages=False)``, the A/B control);
* ``message``: the start of every chat message (a ``<|im_start|>`` at position p), snapped down
  to the block grid: ``p // G * G`` with G the KV block size;
* ``prompt_end``: the last grid point before the prompt's last token, ``(n - 1) // G * G``, so
  the same prompt sent again resumes at most G tokens before its end.

Why this is exact (the argument the warm == cold tests check):

1. *Prefix-stable.* Whether a grid point q is a chunk or message cut depends only on the tokens
   [0, q + G): C is fixed, and a message cut looks ahead at most G - 1 tokens. A snapshot at b
   is keyed by the hash of [0, b); every cut below b lies at q <= b - G, so it is decided by
   tokens the key covers: producer and consumer cut [0, b) alike. The consumer checks that b is
   one of *its own* cuts before it looks b up, so its cold run cuts at b too.
2. *KV blocks.* A block's KV depends on where the chunks holding it start (a chunk's end does
   not change a causal token's bits: that was already today's premise for the prompt's last,
   short chunk). With G equal to the block size, the cuts below a block's end are decided by
   the tokens its hash covers (point 1).
3. *The prompt-end cut is not prefix-stable* (it depends on where the prompt stops). It moves
   only the last chunk's start, so a snapshot there serves only requests that cut there too
   (checked as in 1), and the blocks computed in that last chunk are not registered: the
   registration limit stops at the cut.
4. *Never from decode.* Blocks are registered only below the prompt end: KV written by decode
   (token-by-token, other kernels) is never shared, so a re-sent answer is re-prefilled.

Cuts are at least G apart, so no chunk is shorter than a block except the prompt's last one.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


class ResumeKind(enum.Enum):
    """Why a cut is there (a cut that is both a message start and a chunk end is a message)."""

    MESSAGE = "message"
    CHUNK = "chunk"
    PROMPT_END = "prompt_end"


@dataclass(frozen=True)
class ResumePoints:
    """One prompt's cuts, computed once when the request arrives (``ResumeRule.points``).

    ``cuts``: ascending positions in (0, n), each a multiple of the grid, where a prefill chunk
    ends and a hit may resume. ``saves``: where snapshots are taken: every cut, plus the prompt
    end when it is a chunk multiple (a longer prompt cuts there too) and the last chunk did not
    start at a prompt-end cut. ``register_limit``: blocks
    wholly below it may be registered for sharing (point 3 and 4 of the module docstring)."""

    prompt_len: int
    cuts: tuple[int, ...]
    kinds: tuple[ResumeKind, ...]
    saves: frozenset[int]
    register_limit: int

    def next_end(self, start: int) -> int:
        """Where the prefill chunk starting at ``start`` ends: the next cut, or the prompt end."""
        for c in self.cuts:  # a handful per prompt: linear is fine
            if c > start:
                return c
        return self.prompt_len

    def kind(self, b: int) -> ResumeKind:
        return self.kinds[self.cuts.index(b)]


@dataclass(frozen=True)
class ResumeRule:
    """The cut rule of one server: C, the grid, the message-start ids, messages on or off."""

    chunk: int
    grid: int
    boundary_ids: frozenset[int] = frozenset()
    messages: bool = True

    def __post_init__(self) -> None:
        if self.grid < 1 or self.chunk < 1 or self.chunk % self.grid:
            raise ValueError(
                f"the prefill chunk ({self.chunk}) must be a positive multiple of the grid "
                f"({self.grid})"
            )

    def points(self, tokens: Sequence[int]) -> ResumePoints:
        n = len(tokens)
        g, c = self.grid, self.chunk
        kinds: dict[int, ResumeKind] = {k: ResumeKind.CHUNK for k in range(c, n, c)}
        limit = n
        if self.messages:
            for p in _positions(tokens, self.boundary_ids):
                if p >= g:
                    kinds[p // g * g] = ResumeKind.MESSAGE
            end = (n - 1) // g * g
            if end > 0 and end not in kinds:
                kinds[end] = ResumeKind.PROMPT_END
                limit = end
        cuts = tuple(sorted(kinds))
        saves = set(cuts)
        if n % c == 0 and limit == n:  # not after a prompt-end cut: its state is not shared
            saves.add(n)
        return ResumePoints(
            prompt_len=n,
            cuts=cuts,
            kinds=tuple(kinds[q] for q in cuts),
            saves=frozenset(saves),
            register_limit=limit,
        )


def _positions(tokens: Sequence[int], ids: frozenset[int]) -> Iterator[int]:
    """Where any of ``ids`` occurs in ``tokens`` (``list.index`` runs at C speed: a 100k-token
    prompt with one message-start id takes well under a millisecond)."""
    seq = tokens if isinstance(tokens, list) else list(tokens)
    for tid in ids:
        i = -1
        while True:
            try:
                i = seq.index(tid, i + 1)
            except ValueError:
                break
            yield i
