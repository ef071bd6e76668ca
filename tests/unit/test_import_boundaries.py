"""Arrows point down: the packages import each other only in the allowed directions.

Every import statement counts, including ones inside functions (a lazy import is still a
dependency). Layers, top to bottom: cli -> server / llm -> engine -> model -> cache; the
offline API (``llm``) and the HTTP server are siblings; ``cache`` is pure bookkeeping.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "tt_serve"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _files(package: str) -> list[Path]:
    base = ROOT / package
    return sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]


def _offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in _files(package):
        for name in sorted(_imports(path)):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT.parent)} imports {name}")
    return bad


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        # The cache is stdlib-only bookkeeping: it knows no model, engine or tensor.
        ("cache", ("tt_serve.model", "tt_serve.engine", "tt_serve.server", "torch", "ttnn")),
        # Backends return tokens; they never reach up into the engine or the server.
        ("model", ("tt_serve.engine", "tt_serve.server", "tt_serve.llm", "tt_serve.cli")),
        ("engine", ("tt_serve.server", "tt_serve.llm", "tt_serve.cli")),
        ("server", ("tt_serve.llm", "tt_serve.cli")),
        ("config", ("tt_serve.engine", "tt_serve.model", "tt_serve.server", "tt_serve.llm")),
        # torch: the backend (model/torch) -> the reference numerics (model/ref) -> the compiled
        # kernels (model/kernels), and model/torch -> model/kernels; never back up.
        ("model/ref", ("tt_serve.model.torch", "tt_serve.model.launch")),
        ("model/kernels", ("tt_serve.model",)),
        ("logprobs", ("tt_serve.engine", "tt_serve.model", "torch")),
        # ttnn: the device program knows neither the device model nor the planner, and the
        # numpy layout knows no device program (launch -> plan -> {runtime, virtual} -> boards;
        # runtime -> layout; runtime -> ops -> layout).
        (
            "model/tt/runtime",
            (
                "tt_serve.model.tt.virtual",
                "tt_serve.model.tt.plan",
                "tt_serve.model.tt.launch",
                "tt_serve.model.tt.probe",
            ),
        ),
        (
            "model/tt/layout",
            (
                "tt_serve.model.tt.runtime",
                "tt_serve.model.tt.virtual",
                "tt_serve.model.tt.plan",
                "tt_serve.model.tt.launch",
                "tt_serve.model.tt.ops",
                "tt_serve.model.tt.boards",
                "ttnn",
            ),
        ),
        (
            "model/tt/virtual",
            (
                "tt_serve.model.tt.runtime",
                "tt_serve.model.tt.plan",
                "tt_serve.model.tt.launch",
                "tt_serve.model.tt.layout",
            ),
        ),
        # The board table is the real start's: it knows no device model, planner or program.
        (
            "model/tt/boards",
            (
                "tt_serve.model.tt.virtual",
                "tt_serve.model.tt.plan",
                "tt_serve.model.tt.runtime",
                "tt_serve.model.tt.launch",
                "tt_serve.model.tt.layout",
                "tt_serve.model.tt.ops",
            ),
        ),
        ("model/tt/plan", ("tt_serve.model.tt.launch",)),
        (
            "model/tt/ops",
            (
                "tt_serve.model.tt.runtime",
                "tt_serve.model.tt.virtual",
                "tt_serve.model.tt.plan",
                "tt_serve.model.tt.boards",
            ),
        ),
    ],
)
def test_arrows_point_down(package: str, forbidden: tuple[str, ...]) -> None:
    assert _offenders(package, forbidden) == []


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_circles() -> None:
    """No two modules of tt_serve import each other, directly or through others (lazy imports
    count): the house reads top to bottom."""
    modules = {_module(p): p for p in ROOT.rglob("*.py")}

    def target(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {
        m: {t for n in _imports(p) if (t := target(n)) is not None and t != m}
        for m, p in modules.items()
    }
    # Tarjan's strongly connected components: every one larger than a module is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_kernels_are_a_leaf() -> None:
    """``model/kernels`` (the compiled kernels both the reference numerics and the torch backend
    call) imports nothing of tt_serve but ``tt_serve.user_cache``."""
    bad = [
        f"{path.relative_to(ROOT.parent)} imports {name}"
        for path in _files("model/kernels")
        for name in sorted(_imports(path))
        if name.split(".")[0] == "tt_serve"
        and name != "tt_serve.user_cache"
        and not name.startswith("tt_serve.user_cache.")
    ]
    assert _files("model/kernels") and bad == []


def test_backend_types_stay_inside_model() -> None:
    """Outside ``model/`` no code tells one backend from another by its concrete type (a
    protocol's capability check, such as ``PipelinedBackend``, is fine): the engine factory
    takes what ``model/launch.py`` started."""
    bad = []
    for path in ROOT.rglob("*.py"):
        if path.is_relative_to(ROOT / "model"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
                and any(b in ast.unparse(node.args[1]) for b in ("TTBackend", "TorchBackend"))
            ):
                bad.append(f"{path.relative_to(ROOT.parent)}: {ast.unparse(node)}")
    assert bad == []


def test_the_scheduler_is_the_caches_only_client() -> None:
    """In the engine package only the scheduler imports ``tt_serve.cache``: the engine drives
    the step and never touches blocks or snapshots itself."""
    users = [
        p.name
        for p in _files("engine")
        if any(n == "tt_serve.cache" or n.startswith("tt_serve.cache.") for n in _imports(p))
    ]
    assert users == ["scheduler.py"]


def test_bookkeeping_and_server_import_no_torch_at_module_level() -> None:
    """engine/, cache/ and server/ are tested without torch: only function-local (lazy) imports
    of a backend may bring it in."""
    bad = []
    for package in ("engine", "cache", "server"):
        for path in _files(package):
            for node in ast.parse(path.read_text()).body:
                mods: list[str] = []
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    mods = [node.module]
                bad += [
                    f"{path.name}: {m}"
                    for m in mods
                    if m.split(".")[0] in ("torch", "ttnn")
                    or m.startswith(
                        ("tt_serve.model.ref", "tt_serve.model.torch", "tt_serve.model.kernels")
                    )
                ]
    assert bad == []


def test_the_golden_tier_is_a_check() -> None:
    """``model/tt/golden`` (ttnn's golden functions beside the virtual device, ttnn venv only)
    is a check like the mock tier: no runtime, launch, serving or planning code imports it; only
    the ``check-numerics`` command does, lazily."""
    golden = "tt_serve.model.tt.golden"
    bad = [
        f"{path.relative_to(ROOT.parent)} imports {name}"
        for path in sorted(ROOT.rglob("*.py"))
        if not path.is_relative_to(ROOT / "model" / "tt" / "golden") and path != ROOT / "cli.py"
        for name in sorted(_imports(path))
        if name == golden or name.startswith(golden + ".")
    ]
    assert bad == []
    assert golden + ".check" in _imports(ROOT / "cli.py")
