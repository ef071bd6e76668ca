"""The soak harness: its slope fit and seeded mix (fast), a short clean run that passes every
check, and the same run against a server leaking memory per request, which fails on RSS alone."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.soak.mix import WEIGHTS, Mix
from bench.soak.watch import Sample, per_minute, slope

REPO = Path(__file__).resolve().parents[2]
SHORT = ["--minutes", "0.75", "--concurrency", "4", "--max-compare", "64", "--no-ledger"]


def test_slope_recovers_a_line_and_ignores_noise_free_constants() -> None:
    ts = [float(t) for t in range(20)]
    assert slope(ts, [3.0 + 2.5 * t for t in ts]) == pytest.approx(2.5)
    assert slope(ts, [7.0] * 20) == 0.0
    assert slope([1.0], [1.0]) is None
    assert slope([2.0, 2.0], [1.0, 5.0]) is None


def test_slope_of_a_noisy_line_is_near_its_trend() -> None:
    # Uniform noise of width 8 (the connections in flight) on a 1/s trend over 100 samples:
    # sigma = 8 / sqrt(12) = 2.31, the fit's standard error sigma / sqrt(sum (t - mean)^2)
    # = 2.31 / 289 = 0.008, so 0.05 is about 6 standard errors.
    rng = random.Random(1)
    ts = [float(t) for t in range(100)]
    ys = [t + rng.uniform(0, 8) for t in ts]
    fit = slope(ts, ys)
    assert fit is not None and abs(fit - 1.0) < 0.05


def test_per_minute_fits_only_the_window() -> None:
    # Warm-up growth in the first half must not count: flat after t = 10.
    samples = [Sample(float(t), min(t, 10) * 100.0, 10, 5, 0.0) for t in range(21)]
    assert per_minute(samples, "rss_mib", 10, 20) == 0.0
    assert per_minute(samples, "rss_mib", 0, 10) == pytest.approx(6000.0)


def _kinds(mix: Mix, n: int) -> list[str]:
    return [mix.item(i).kind for i in range(n)]


def test_the_mix_is_reproducible_for_a_seed_in_any_order() -> None:
    a, b = Mix(7, 2048, "m"), Mix(7, 2048, "m")
    forward = [a.item(i) for i in range(200)]
    backward = [b.item(i) for i in reversed(range(200))][::-1]
    assert forward == backward
    assert _kinds(Mix(8, 2048, "m"), 200) != _kinds(a, 200)
    assert set(_kinds(a, 200)) == set(WEIGHTS)


def test_bad_and_oversized_items_expect_their_errors() -> None:
    mix = Mix(3, 2048, "m")
    items = [mix.item(i) for i in range(400)]
    for it in items:
        if it.kind in ("bad_input", "oversized"):
            assert it.single is not None and it.single.expect in (400, 404)
        if it.kind == "oversized":
            assert it.single is not None and it.single.error_names == "2048"
        if it.greedy and it.single is not None:
            assert it.single.body is not None and it.single.body["temperature"] == 0.0
    convos = [it.conversation for it in items if it.conversation is not None]
    assert {c.api for c in convos} == {"chat", "responses", "messages"}


def _soak(extra_env: dict[str, str], args: list[str] = SHORT) -> tuple[int, dict[str, Any]]:
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra_env)
    cmd = [sys.executable, "-m", "bench.soak", *args]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    try:
        report = json.loads(res.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"no JSON report (rc {res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-4000:]}"
        )
    return res.returncode, report


@pytest.mark.slow
def test_a_short_clean_soak_passes_every_check() -> None:
    rc, report = _soak({})
    checks = report["checks"]
    assert rc == 0 and report["ok"], {k: v for k, v in checks.items() if not v["ok"]}
    assert checks["equivalence"]["comparisons"] > 0
    assert checks["equivalence"]["defects"] == 0
    assert checks["statuses"]["server_errors"] == 0
    assert checks["churn"]["tier_restores"] > 0
    assert checks["drain"]["exit_status"] == 0
    assert report["phases"]["steady"]["streams"] > 0


@pytest.mark.slow
def test_a_server_leaking_per_request_fails_the_rss_check_only() -> None:
    # 1 MiB per finished request: about 0.7 MiB per request of the mix (bad inputs, drops and
    # timeouts finish none), several times the 256 KiB bound.
    # Half a minute and a small replay sample: the leak shows within seconds.
    leak = ["--minutes", "0.5", "--concurrency", "4", "--max-compare", "16", "--no-ledger"]
    rc, report = _soak({"TT_SERVE_FAULT_LEAK_KB": "1024"}, leak)
    assert rc == 1 and not report["ok"]
    assert report["failed"] == ["rss"], report["failed"]
    assert report["checks"]["rss"]["kib_per_request"] > 256
