"""The prefix-hit equivalence checker is not blind: it fails on a corrupted restore, on a run
where nothing hit the cache and on empty outputs, and passes on the real server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cache.prefix_hit_equivalence import check, main
from tests.bench.conftest import TINY_VOCAB, serve_tiny
from tests.bench.fake_openai import fake_server

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("corrupt", "warm: tokens differ from cold"),
        ("nohit", "nothing hit the cache"),
        ("empty", "empty output"),
    ],
)
def test_fails_on_broken_servers(mode: str, why: str) -> None:
    with fake_server(mode) as url:
        report = check(url, cases=2, head=64, suffix=8, max_tokens=4)
        assert not report.ok
        assert any(why in f for f in report.failures), report.failures
        assert (
            main(
                ["--url", url, "--cases", "2", "--head", "64", "--suffix", "8", "--max-tokens", "4"]
            )
            == 1
        )


def test_passes_on_a_correct_fake() -> None:
    # The fixtures above differ from this one only in the broken behaviour.
    with fake_server("correct") as url:
        report = check(url, cases=2, head=64, suffix=8, max_tokens=4)
        assert report.ok, report.failures
        assert all(c["warm_cached"] > 0 and c["cold_cached"] == 0 for c in report.cases)


def test_fails_when_the_cold_run_was_not_cold() -> None:
    with fake_server("correct") as url:
        check(url, cases=2, head=64, suffix=8, max_tokens=4, seed=5)
        report = check(url, cases=2, head=64, suffix=8, max_tokens=4, seed=5)
        assert any("was not cold" in f for f in report.failures)


@pytest.mark.slow
def test_passes_on_the_real_server(tiny_model: Path) -> None:
    # Snapshot slots for every case in flight (8): a hit evicted by a neighbour is not compared.
    # 96 cases: the default run's 384 are the demo-model test's below.
    warm = serve_tiny(tiny_model, snapshot_slots=256)
    with warm as url, serve_tiny(tiny_model, prefix_caching=False) as ctl:
        cmd = [
            sys.executable,
            "-m",
            "bench.cache.prefix_hit_equivalence",
            "--cases",
            "96",
            "--url",
            url,
            "--control-url",
            ctl,
            "--head",
            "128",
            "--suffix",
            "16",
            "--max-tokens",
            "8",
            "--vocab",
            str(TINY_VOCAB),
        ]
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        out = json.loads(res.stdout)
        assert out["ok"] and all(c["warm_cached"] == 128 for c in out["cases"])


def test_compares_token_ids_on_the_real_server(tiny_model: Path) -> None:
    import httpx

    from bench.cache.prefix_hit_equivalence import _diff, complete

    with serve_tiny(tiny_model) as url, httpx.Client(base_url=url, timeout=120) as c:
        run = complete(c, list(range(5, 40)), 4)
    assert run.token_ids is not None and len(run.token_ids) == 4
    assert _diff("warm", run, run, 1e-3) == []
    changed = type(run)(
        run.tokens,
        run.logprobs,
        run.cached_tokens,
        run.completion_tokens,
        [run.token_ids[0] + 1, *run.token_ids[1:]],
    )
    assert _diff("warm", run, changed, 1e-3) == [
        "warm: token ids differ from cold at output position 0"
    ]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tt_serve.demo import write_demo_model

    return Path(write_demo_model(tmp_path_factory.mktemp("demo") / "m", seed=0, dtype="float32"))


@pytest.mark.slow
@pytest.mark.parametrize("fault_every", [0, 128], ids=["clean", "defect-1-in-128"])
def test_the_default_run_excludes_1_in_128_and_catches_it(
    demo_dir: Path, fault_every: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default run's 384 cases on the demo model (a 128-token head, two chunks, a 16-token
    suffix, 8 tokens out: short enough for CI's slow tier): clean, it states "excludes 1/128 at
    95%"; with the test hook perturbing one GDN restore in 128 on the warm server (chosen by the
    snapshot's bits: the same ones at any interleaving), it fails, at its first defect
    (``fail_fast``, which a clean run never triggers)."""
    from tests.server.conftest import serve

    with serve(demo_dir, prefix_caching=False) as ctl:
        if fault_every:
            monkeypatch.setenv("TT_SERVE_FAULT_RESTORE_EVERY", str(fault_every))
        # A slot for every snapshot the run makes (about 4 a case, 210 KiB each: 430 MiB): none
        # is evicted, so no case's hit depends on how its neighbours interleave (with 256 slots
        # a loaded CI machine once saw 2 of 384 warm runs miss: blind, and counted as failed).
        with serve(demo_dir, max_model_len=1024, snapshot_slots=2048) as warm:
            monkeypatch.delenv("TT_SERVE_FAULT_RESTORE_EVERY", raising=False)
            # With the defect, the run stops at the first one: failing is all it must show.
            report = check(
                warm.url,
                control_url=ctl.url,
                concurrency=8,
                head=128,
                suffix=16,
                max_tokens=8,
                fail_fast=True,
            )
    gate = report.gate
    if not fault_every:
        assert report.ok, report.failures[:5]
        assert gate["comparisons"] == gate["clean"] == 384
        assert gate["excludes"] == "384 clean of 384: excludes 1/128 at 95%"
    else:
        assert not report.ok and gate["defects"] >= 1, gate
        assert all("differ from cold" in f for f in report.failures), report.failures[:5]
        assert not gate["excludes_target"]
