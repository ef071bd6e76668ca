"""Every .nix file in the repository parses with the real Nix parser."""

from __future__ import annotations

from pathlib import Path

from tests.nix.nixtools import ROOT, nix_tool, repo_files, run


def test_every_nix_file_parses() -> None:
    files = repo_files("*.nix")
    # The deployment files must be among them (an empty list would pass vacuously).
    for required in ("flake.nix", "modules/tenstorrent-serving.nix", "modules/lib/invariants.nix"):
        assert required in files
    result = run([nix_tool("nix-instantiate"), "--parse", *files])
    assert result.returncode == 0, result.stderr


def test_parse_rejects_a_syntax_error(tmp_path: Path) -> None:
    bad = ROOT / "tests" / "nix" / "stub-nixpkgs" / "flake.nix"
    broken = bad.read_text().replace("outputs =", "outputs ==", 1)
    path = tmp_path / "broken.nix"
    path.write_text(broken)
    result = run([nix_tool("nix-instantiate"), "--parse", str(path)])
    assert result.returncode != 0
    assert "syntax error" in result.stderr
