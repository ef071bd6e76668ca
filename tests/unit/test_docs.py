"""The docs cannot rot: README.md stays short and reaches the docs index, the index reaches every
page, every relative link and anchor resolves, and every fenced block marked ``runnable``
(```` ```sh runnable ```` or ```` ```python runnable ````) runs and exits 0 on the demo model.

The runnable blocks of a page run in order, as a reader follows the page, in a copy of the
checkout (so nothing they write lands in it) with ``.venv`` pointing at the running venv and a
demo-model server standing in for the ``127.0.0.1:8000`` the pages name.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_server import run_server, stop, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 250


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _prose(text: str) -> str:
    """The page without its fenced blocks (links inside code are not links)."""
    return FENCE.sub("", text)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in _prose(page.read_text()).splitlines():
        if m := re.match(r"^#{1,6} (.*)", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def runnable_blocks(page: Path) -> list[tuple[str, str]]:
    """(language, code) of each block whose info string says ``runnable``."""
    blocks = []
    for m in FENCE.finditer(page.read_text()):
        lang, rest, code = m.group(1), m.group(2), m.group(3)
        if "runnable" in rest.split():
            assert lang in ("sh", "python"), f"{_rel(page)}: a runnable block is sh or python"
            blocks.append((lang, code))
    return blocks


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    shell = [m.group(3).strip() for m in FENCE.finditer(text) if m.group(1) == "sh"][:3]
    assert shell[0] == "make serve" and any(f.startswith("make test") for f in shell), shell


def test_the_index_reaches_every_page() -> None:
    readme = _prose((ROOT / "README.md").read_text())
    assert "docs/README.md" in readme, "README.md must link the docs index"
    index = ROOT / "docs" / "README.md"
    linked = {Path(t.split("#")[0]).name for t in LINK.findall(_prose(index.read_text()))}
    missing = [p.name for p in PAGES[1:] if p.name != "README.md" and p.name not in linked]
    assert not missing, f"docs/README.md does not link {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves(page: Path) -> None:
    bad = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not bad, f"{_rel(page)}: " + "; ".join(bad)


def test_there_are_runnable_blocks() -> None:
    assert sum(len(runnable_blocks(p)) for p in PAGES) >= 10


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout (no .git, no venvs) whose ``.venv`` is the running one."""
    dest = tmp_path_factory.mktemp("docs") / "tt-serve"
    skip = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.egg-info", ".*_cache")
    shutil.copytree(ROOT, dest, ignore=skip)
    (dest / ".venv").symlink_to(Path(sys.prefix))
    return dest


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """``tt-serve serve`` on the demo model (as ``make serve`` runs it), on a free port."""
    proc, url = run_server([])
    try:
        wait_healthy(url, proc)
        yield url.removeprefix("http://")
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", [p for p in PAGES if runnable_blocks(p)], ids=_rel
)  # fmt: skip
def test_the_runnable_blocks_run(page: Path, checkout: Path, server: str) -> None:
    env = dict(os.environ, PATH=f"{checkout / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    for i, (lang, code) in enumerate(runnable_blocks(page)):
        code = code.replace("127.0.0.1:8000", server)
        cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable]
        res = subprocess.run(
            cmd, cwd=checkout, env=env, input=code if lang == "python" else None,
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert res.returncode == 0, (
            f"{_rel(page)} runnable block {i + 1} exited {res.returncode}:\n{code}\n"
            f"--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-3000:]}"
        )
