"""The agent conversations: one shared system + tools head, a distinct task per agent, a tool
result after every answer, and the two ways a client re-sends an answer.

Everything is a pure function of the seed and the sizes. Lengths are in tokens of the model's own
tokenizer, measured in-process: the head is the rendered system turn with the tools (what every
request starts with), a task or a tool result is its message content. Text is drawn from a fixed
word list (prose for the system text and tasks, log lines with paths and numbers for tool
results), so it tokenizes like ordinary English and code, not like random ids.

A turn's request is the whole history: ``[system, task, (answer, tool result) x (turn - 1)]``.
Tool results are ``tool`` messages (the chat template renders consecutive ones as one user turn
of ``<tool_response>`` blocks, as Qwen3.5's does); each carries a ``tool_call_id`` as OpenAI's
schema has it, though the assistant turn before it holds no call (a random-weight model emits
none; neither server asks for one).

Re-sending an answer (``MODES``):

* ``verbatim``: the assistant message exactly as returned (content, and tool calls or reasoning
  if the server parsed any);
* ``rerendered``: what agent frameworks do before the next turn: drop ``<think>`` blocks and
  normalise whitespace (runs collapsed to one space, ends stripped). The re-sent token ids then
  differ from the generated ones from the first changed character on, so a cache can only
  resume up to the start of that message.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

MODES = ("verbatim", "rerendered")

_PROSE = (
    "the agent reads each file before it edits anything and keeps a short plan of the steps "
    "that remain open while the tests run in the background a failing case is narrowed down "
    "to one function then the fix is written with a regression test next to it the build "
    "must stay green on every commit and the logs are checked for warnings that point at a "
    "deeper problem when a tool returns an error the agent retries once with a smaller input "
    "and otherwise reports what it found so that a person can decide results are summarised "
    "in plain words with the paths and line numbers that matter configuration lives in one "
    "place and defaults are documented next to the option that sets them the cache is warm "
    "after the first request and later turns reuse the shared prefix of the conversation "
    "timeouts are bounded every loop stops by itself and nothing is sent outside the machine"
)
WORDS = tuple(_PROSE.split())
"""Prose words (system text, tasks, the prose part of tool results)."""

_DIRS = ("src", "lib", "tests", "tools", "docs", "bench", "scripts")
_EXTS = (".py", ".rs", ".md", ".toml", ".json")
_LEVELS = ("INFO", "WARN", "DEBUG", "ERROR")


def _tool(name: str, doc: str, params: dict[str, tuple[str, str]], required: list[str]) -> Any:
    props = {k: {"type": t, "description": d} for k, (t, d) in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": doc,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


TOOLS: list[dict[str, Any]] = [
    _tool(
        "read_file",
        "Read a text file from the repository and return its content with line numbers.",
        {
            "path": ("string", "Path relative to the repository root."),
            "start": ("integer", "First line to return (1-based)."),
            "end": ("integer", "Last line to return (inclusive)."),
        },
        ["path"],
    ),
    _tool(
        "edit_file",
        "Replace an exact, unique string in a file with another string.",
        {
            "path": ("string", "Path relative to the repository root."),
            "old": ("string", "The exact text to replace; it must occur once."),
            "new": ("string", "The replacement text."),
        },
        ["path", "old", "new"],
    ),
    _tool(
        "grep",
        "Search the repository for a regular expression and return matching lines.",
        {
            "pattern": ("string", "A regular expression."),
            "glob": ("string", "Only files whose path matches this glob."),
            "context": ("integer", "Lines of context around each match."),
        },
        ["pattern"],
    ),
    _tool(
        "run_tests",
        "Run the test suite, or a subset of it, and return the summary and any failures.",
        {
            "selector": ("string", "A test file, directory or node id; empty: everything."),
            "timeout": ("integer", "Seconds before the run is stopped."),
        },
        [],
    ),
    _tool(
        "list_dir",
        "List the entries of a directory with their sizes.",
        {"path": ("string", "Directory path relative to the repository root.")},
        ["path"],
    ),
    _tool(
        "shell",
        "Run a shell command in the repository and return its exit code, stdout and stderr.",
        {
            "command": ("string", "The command line."),
            "timeout": ("integer", "Seconds before the command is stopped."),
        },
        ["command"],
    ),
]


class TokenCounter(Protocol):
    """What the workload needs of a tokenizer (``tt_serve.tokenizer.Tokenizer`` is one)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def apply_chat_template(
        self, messages: object, *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str: ...


@dataclass(frozen=True)
class Sizes:
    """The workload's shape; lengths in tokens."""

    agents: int = 8
    turns: int = 6
    head: int = 1500
    """The rendered system turn with the tools: shared by every request."""
    task: int = 150
    """Each agent's first user message."""
    tool: int = 300
    """Each tool result's content."""
    answer: int = 100
    """Generated tokens per turn (``max_tokens`` with ``ignore_eos``)."""

    def __post_init__(self) -> None:
        if min(self.agents, self.turns, self.task, self.tool, self.answer) < 1:
            raise ValueError(f"every size must be >= 1: {self}")

    def longest_prompt(self) -> int:
        """An upper estimate of the last turn's prompt (template tokens included)."""
        per_turn = self.answer + self.tool + 32
        return self.head + self.task + 32 + (self.turns - 1) * per_turn


def _prose(rng: random.Random, n: int) -> str:
    out: list[str] = []
    for i in range(n):
        w = rng.choice(WORDS)
        out.append(w.capitalize() if i == 0 or out[-1].endswith(".") else w)
        if rng.random() < 0.08:
            out[-1] += "."
    text = " ".join(out)
    return text if text.endswith(".") else text + "."


def _log_lines(rng: random.Random, n: int) -> str:
    lines = []
    for _ in range(n):
        path = f"{rng.choice(_DIRS)}/{rng.choice(WORDS)}_{rng.randrange(100)}{rng.choice(_EXTS)}"
        lines.append(
            f"{path}:{rng.randrange(1, 900)}: {rng.choice(_LEVELS)} {_prose(rng, rng.randint(4, 9))}"
        )
    return "\n".join(lines)


def fit(make: Callable[[int], str], count: Callable[[str], int], target: int) -> str:
    """``make(n)`` for the smallest n whose text counts at least ``target`` tokens (``make`` must
    grow with n, and ``make(n)`` be a prefix-stable function of n, e.g. seeded afresh)."""
    hi = 1
    while count(make(hi)) < target:
        hi *= 2
    lo = hi // 2
    while lo + 1 < hi:  # count(make(lo)) < target <= count(make(hi)), or lo == 0
        mid = (lo + hi) // 2
        if count(make(mid)) < target:
            lo = mid
        else:
            hi = mid
    return make(hi)


def _seeded(seed: int, *key: object) -> random.Random:
    return random.Random(f"agent-replay|{seed}|" + "|".join(map(str, key)))


def _task(seed: int, agent: int, n: int) -> str:
    return f"Task {agent + 1}: " + _prose(_seeded(seed, "task", agent), n)


def _tool_result(seed: int, agent: int, turn: int, n: int) -> str:
    return _log_lines(_seeded(seed, "tool", agent, turn), n)


@dataclass(frozen=True)
class Workload:
    """The texts of one run: the shared head, each agent's task, each (agent, turn)'s tool
    result (the one sent after that turn's answer)."""

    sizes: Sizes
    seed: int
    thinking: bool
    """The template's ``enable_thinking``: off, the generation prompt closes an empty think
    block (and earlier answers render without one); on, it opens one and the answer is
    reasoning until ``</think>``. Both servers get it (llama-server always defines it)."""
    system: str
    tools: list[dict[str, Any]]
    tasks: tuple[str, ...]
    results: tuple[tuple[str, ...], ...]

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """The chat template variables every request sets (``chat_template_kwargs``)."""
        return {"enable_thinking": self.thinking}

    def conversation(self, agent: int, mode: str) -> Conversation:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        first = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.tasks[agent]},
        ]
        return Conversation(self, agent, mode, first)


def head_tokens(tok: TokenCounter, system: str, tools: list[dict[str, Any]]) -> int:
    """Tokens of the rendered system turn with the tools (what every request starts with)."""
    msgs = [{"role": "system", "content": system}]
    return len(tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=False, tools=tools)))


def build(sizes: Sizes, seed: int, tok: TokenCounter, *, thinking: bool = False) -> Workload:
    """The workload of ``sizes`` and ``seed``, lengths measured with ``tok``."""

    def count(text: str) -> int:
        return len(tok.encode(text))

    tools = TOOLS
    bare = head_tokens(tok, "", tools)
    intro = "You are a coding agent working in a large repository. "
    system = fit(
        lambda n: intro + _prose(_seeded(seed, "system"), n),
        lambda text: head_tokens(tok, text, tools),
        max(sizes.head, bare + 1),
    )
    tasks = tuple(fit(partial(_task, seed, a), count, sizes.task) for a in range(sizes.agents))
    results = tuple(
        tuple(
            fit(partial(_tool_result, seed, a, t), count, sizes.tool)
            for t in range(sizes.turns - 1)
        )
        for a in range(sizes.agents)
    )
    return Workload(sizes, seed, thinking, system, tools, tasks, results)


_THINK = re.compile(r"<think>.*?</think>", re.S)


def rerender(text: str) -> str:
    """An answer as an agent framework re-sends it: ``<think>`` blocks dropped, whitespace runs
    collapsed to one space, ends stripped."""
    return " ".join(_THINK.sub(" ", text).split())


@dataclass
class Answer:
    """An assistant message as the server returned it."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    """The generated ids, when the server returns them (tt-serve's ``return_token_ids``)."""

    def message(self, mode: str) -> dict[str, Any]:
        """The message the client re-sends in ``mode``."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if mode == "rerendered":
            msg["content"] = rerender(self.content)
        elif self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


@dataclass
class Conversation:
    """One agent's history; ``messages`` is the next request's."""

    workload: Workload
    agent: int
    mode: str
    messages: list[dict[str, Any]]
    turn: int = 0
    """Answers added so far."""

    def add(self, answer: Answer) -> None:
        """Append the answer (as ``mode`` re-sends it) and the tool result that follows it."""
        result = self.workload.results[self.agent][self.turn]
        self.messages.append(answer.message(self.mode))
        call_id = f"call_{self.agent}_{self.turn}"
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        self.turn += 1

    def add_user_result(self, answer: Answer, result: str) -> None:
        """Append the answer and the tool result as the next user message (the API arms')."""
        self.messages.append(answer.message(self.mode))
        self.messages.append({"role": "user", "content": result})
        self.turn += 1

    def prompt_ids(self, tok: TokenCounter) -> list[int]:
        """The next request's prompt as the chat template renders it (generation prompt on)."""
        wl = self.workload
        text = tok.apply_chat_template(self.messages, tools=wl.tools, **wl.template_kwargs)
        return tok.encode(text)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
