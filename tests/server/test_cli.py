"""The command line as a user runs it: `tt-serve serve` (also with no --model: the demo model
is created in the user's cache on first use), `generate --json`, and config refusals."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.cli_server import CLI, run_server, stop, wait_healthy
from tests.server.conftest import MODEL_NAME


@pytest.mark.slow
def test_serve_without_model_creates_the_demo_model(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc, url = run_server(["--kv-blocks", "256"], env)
    try:
        wait_healthy(url, proc)
        r = httpx.post(
            f"{url}/v1/completions",
            json={"model": "demo-qwen3_5-v1", "prompt": "Hello", "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
    finally:
        out = stop(proc)
    assert "demo model" in out.lower()
    assert (tmp_path / "cache" / "tt-serve").is_dir()


@pytest.mark.slow
def test_serve_binds_loopback_and_serves_a_model_dir(demo_dir: Path) -> None:
    proc, url = run_server(
        ["--model", str(demo_dir), "--served-model-name", MODEL_NAME, "--kv-blocks", "256"]
    )
    try:
        wait_healthy(url, proc)
        models = httpx.get(f"{url}/v1/models").json()
        assert models["data"][0]["id"] == MODEL_NAME
    finally:
        stop(proc)


def test_serve_refuses_invalid_config() -> None:
    r = subprocess.run(
        [*CLI, "serve", "--device-resident", "--no-device-argmax"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    assert "deviceResident" in r.stderr and "deviceArgmax" in r.stderr


@pytest.mark.slow
def test_serve_refuses_bf16_on_a_cpu_without_bf16_matmuls(tmp_path: Path) -> None:
    from tt_serve.config import ServeConfig
    from tt_serve.model.ref.layers import cpu_bf16
    from tt_serve.server.run import slow_precision

    assert slow_precision(ServeConfig()) is None  # float32 on the CPU
    assert slow_precision(ServeConfig(backend="ttnn")) is None
    bf16 = slow_precision(ServeConfig(dtype="bfloat16"))
    if cpu_bf16():
        assert bf16 is None
        return
    assert bf16 is not None and "AVX512-BF16" in bf16 and "--dtype float32" in bf16
    r = subprocess.run(
        [*CLI, "serve", "--dtype", "bfloat16", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--dtype float32" in r.stderr


@pytest.mark.slow
def test_serve_rejects_a_folder_without_config(tmp_path: Path) -> None:
    r = subprocess.run(
        [*CLI, "serve", "--model", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "config.json" in r.stderr


@pytest.mark.slow
def test_generate_json(demo_dir: Path) -> None:
    r = subprocess.run(
        [
            *CLI,
            "generate",
            "--model",
            str(demo_dir),
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # the JSON alone: the engine's log lines go to stderr
    assert len(out["token_ids"]) == 3 and out["finish_reason"] == "length"
    assert isinstance(out["text"], str) and out["cached_tokens"] == 0


@pytest.mark.parametrize(
    "args",
    [pytest.param(["--prompt-ids", ""], marks=pytest.mark.slow), ["--prompt-ids", "1,x"]],
)
def test_generate_bad_input_names_the_problem(demo_dir: Path, args: list[str]) -> None:
    r = subprocess.run(
        [*CLI, "generate", "--model", str(demo_dir), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2
    assert "prompt" in r.stderr or "integers" in r.stderr


def test_the_server_thread_runs_torch_single_threaded_and_the_engine_does_not() -> None:
    """``keep_compute_off_this_thread`` (what ``tt-serve serve`` calls on its main thread): that
    thread's torch ops run on one thread (no OpenMP team next to the engine's), while a loader
    given the returned count, and the engine thread it starts, run with the full count."""
    import threading

    import torch

    from tt_serve.server.run import keep_compute_off_this_thread

    before = torch.get_num_threads()
    seen: dict[str, int] = {}

    def server_main() -> None:  # stands in for the main thread (pytest's must stay as it is)
        threads = keep_compute_off_this_thread()
        seen["returned"], seen["main"] = threads, torch.get_num_threads()

        def loader() -> None:
            torch.set_num_threads(threads)
            engine = threading.Thread(target=lambda: seen.update(engine=torch.get_num_threads()))
            engine.start()
            engine.join()

        t = threading.Thread(target=loader)
        t.start()
        t.join()
        seen["main_after"] = torch.get_num_threads()

    try:
        t = threading.Thread(target=server_main)
        t.start()
        t.join()
    finally:
        torch.set_num_threads(before)
    assert seen == {"returned": before, "main": 1, "engine": before, "main_after": 1}
