"""Deterministic workloads for the load generator, all built from a seed.

A workload is a list of *sessions* run with a concurrency limit. A session is a list of turns run
one after the other: turn 0 is a whole prompt; a later turn re-sends the previous turn's prompt,
then that turn's answer, then new text (an agent loop). Prompts are token ids (the completions
endpoint takes them), drawn from ordinary vocabulary ids so that no special token appears.

The API returns text, not output token ids, so a re-sent answer is represented by ``max_tokens``
ids derived from the streamed text (:func:`answer_ids`): lengths are exact and turn k depends on
turn k-1's real output, which is what a prefix cache sees from a real agent client that re-sends
(and re-tokenizes) the conversation.

Kinds:

* ``agents``: N concurrent agents share a system + tool head of H tokens, T turns each, ``new``
  fresh tokens per turn.
* ``nohead``: the control. The same N x T requests with the same lengths as ``agents``, but every
  request is a fresh random sequence, so nothing can hit a prefix cache (all-miss).
* ``shared-prefix``: G groups x P prompts, each prompt a group head of H tokens + a suffix of S.
  With concurrency 1 the first prompt of a group is cold and the others can be warm.
* ``random``: ``num`` prompts with lengths uniform in [min_len, max_len].
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

TOKEN_LO = 1000
TOKEN_HI = 150_000
"""Prompt ids are drawn from [TOKEN_LO, TOKEN_HI): plain vocabulary of the Qwen tokenizers."""

KINDS = ("agents", "nohead", "shared-prefix", "random")


@dataclass(frozen=True)
class Turn:
    """``ids`` are the new prompt ids of this turn; ``resend`` prepends the conversation so far."""

    ids: tuple[int, ...]
    resend: bool


@dataclass(frozen=True)
class Session:
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class WorkloadSpec:
    """Parameters of one workload; unused fields are ignored by a kind."""

    kind: str = "agents"
    seed: int = 0
    agents: int = 8
    turns: int = 3
    head: int = 2048
    new: int = 64
    groups: int = 1
    per_group: int = 4
    suffix: int = 64
    num: int = 16
    min_len: int = 64
    max_len: int = 512
    max_tokens: int = 8
    concurrency: int = 0
    """0: the natural concurrency (agents: N; shared-prefix: 1; random: num)."""
    vocab: int = 0
    """0: ids from the Qwen vocabulary range; else ids in [vocab // 2, vocab) (tiny models)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> WorkloadSpec:
        """``kind[:key=value,...]``, e.g. ``agents:agents=8,turns=3,head=2048``."""
        kind, _, rest = text.partition(":")
        if kind not in KINDS:
            raise ValueError(f"unknown workload kind {kind!r}; expected one of {KINDS}")
        names = {f.name for f in fields(cls)} - {"kind", "extra"}
        values: dict[str, Any] = {"kind": kind}
        for item in filter(None, rest.split(",")):
            key, sep, val = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in names:
                raise ValueError(f"bad workload parameter {item!r} (known: {sorted(names)})")
            values[key] = int(val)
        spec = cls(**values)
        spec.check()
        return spec

    def check(self) -> None:
        positive = ("agents", "turns", "groups", "per_group", "num", "max_tokens", "min_len")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.head < 0 or self.new < 0 or self.suffix < 0 or self.max_len < self.min_len:
            raise ValueError("lengths must be non-negative and min_len <= max_len")
        if self.kind in ("agents", "nohead") and self.head + self.new < 1:
            raise ValueError("agents need head + new >= 1")
        if self.kind == "shared-prefix" and self.head + self.suffix < 1:
            raise ValueError("shared-prefix needs head + suffix >= 1")

    def params(self) -> dict[str, Any]:
        """The parameters that matter for this kind (for the ledger)."""
        keep = {
            "agents": ("agents", "turns", "head", "new"),
            "nohead": ("agents", "turns", "head", "new"),
            "shared-prefix": ("groups", "per_group", "head", "suffix"),
            "random": ("num", "min_len", "max_len"),
        }[self.kind]
        d = asdict(self)
        out = {k: d[k] for k in ("kind", "seed", *keep, "max_tokens", "vocab")}
        out["concurrency"] = self.effective_concurrency()
        return out

    def effective_concurrency(self) -> int:
        if self.concurrency > 0:
            return self.concurrency
        return {"agents": self.agents, "nohead": self.agents, "shared-prefix": 1}.get(
            self.kind, self.num
        )


def token_range(vocab: int = 0) -> tuple[int, int]:
    """[lo, hi) of prompt ids for a vocabulary size (0: the Qwen range)."""
    return (TOKEN_LO, TOKEN_HI) if vocab <= 0 else (vocab // 2, vocab)


def _ids(rng: random.Random, n: int, vocab: int = 0) -> tuple[int, ...]:
    lo, hi = token_range(vocab)
    return tuple(rng.randrange(lo, hi) for _ in range(n))


def build(spec: WorkloadSpec) -> list[Session]:
    """The sessions of a workload; the same spec always gives the same sessions."""
    rng = random.Random(f"{spec.kind}|{spec.seed}")
    v = spec.vocab
    if spec.kind == "agents":
        head = _ids(rng, spec.head, v)
        return [
            Session(
                tuple(
                    Turn(head + _ids(rng, spec.new, v), False)
                    if k == 0
                    else Turn(_ids(rng, spec.new, v), True)
                    for k in range(spec.turns)
                )
            )
            for _ in range(spec.agents)
        ]
    if spec.kind == "nohead":
        # Turn k of an agent is H + k * (new + max_tokens) + new tokens long; all fresh.
        return [
            Session(
                tuple(
                    Turn(
                        _ids(rng, spec.head + k * (spec.new + spec.max_tokens) + spec.new, v), False
                    )
                    for k in range(spec.turns)
                )
            )
            for _ in range(spec.agents)
        ]
    if spec.kind == "shared-prefix":
        out = []
        for _ in range(spec.groups):
            head = _ids(rng, spec.head, v)
            out += [
                Session((Turn(head + _ids(rng, spec.suffix, v), False),))
                for _ in range(spec.per_group)
            ]
        return out
    if spec.kind == "random":
        return [
            Session((Turn(_ids(rng, rng.randint(spec.min_len, spec.max_len), v), False),))
            for _ in range(spec.num)
        ]
    raise ValueError(f"unknown workload kind {spec.kind!r}")


def answer_ids(text: str, n: int, vocab: int = 0) -> tuple[int, ...]:
    """``n`` ordinary ids standing for an answer's text (deterministic in the text)."""
    rng = random.Random(hashlib.sha256(text.encode()).hexdigest())
    return _ids(rng, n, vocab)


def prompt_sha256(ids: Sequence[int]) -> str:
    """The hash recorded in the ledger for a token-id prompt."""
    return hashlib.sha256(json.dumps(list(ids), separators=(",", ":")).encode()).hexdigest()
