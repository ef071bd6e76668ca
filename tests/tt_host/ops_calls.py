"""Every ttnn function, keyword and attribute ``tt_serve/model/tt/ops/`` uses, read with ast.

The ops modules reach ttnn only as ``self.ttnn.<path>``: calls are collected with their
positional count and keyword names (and where they are: ``file:line``), other uses as attribute
paths. Both tiers use this list: the contract tier checks the fake implements it, the host tier
checks it against the real wheel.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

OPS_DIR = Path(__file__).resolve().parents[2] / "tt_serve" / "model" / "tt" / "ops"


@dataclass(frozen=True)
class Call:
    path: str
    positional: int
    keywords: tuple[str, ...]
    where: str  # "ops/<module>.py:<line>"


def _ttnn_path(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if (
        isinstance(node, ast.Name)
        and node.id == "self"
        and parts
        and parts[-1] == "ttnn"
        and len(parts) > 1
    ):
        return ".".join(reversed(parts[:-1]))
    return None


def extract(source: Path = OPS_DIR) -> tuple[list[Call], list[str]]:
    trees = [
        (f"{source.name}/{f.name}", ast.parse(f.read_text())) for f in sorted(source.glob("*.py"))
    ]
    calls: list[Call] = []
    called: set[int] = set()
    for name, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                path = _ttnn_path(node.func)
                if path is not None:
                    kws = tuple(k.arg for k in node.keywords if k.arg is not None)
                    calls.append(Call(path, len(node.args), kws, f"{name}:{node.lineno}"))
                    called.add(id(node.func))
    attrs: set[str] = set()
    for node in (n for _, tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.Attribute) and id(node) not in called:
            path = _ttnn_path(node)
            if path is not None and not any(p.startswith(path + ".") for p in attrs):
                attrs.add(path)
    # keep only the longest attribute chains (ttnn.ShardStrategy.HEIGHT covers ShardStrategy)
    longest = {a for a in attrs if not any(b.startswith(a + ".") for b in attrs)}
    longest -= {c.path for c in calls}
    return calls, sorted(longest)
