"""Every tt-metal file cited in tt_serve/ is listed here, well formed, and checkable.

``scripts/check-citations`` extracts the citations (repo-relative tt-metal paths in the source)
and, given ``--tt-metal DIR``, checks each exists in that checkout. CITED is the list the source
must cite: a new citation fails here until it is added (after checking it exists in tt-metal).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check-citations"

CITED = [
    "models/common/sampling/tt_sampling.py",
    "models/demos/blackhole/qwen36/tt/moe/prefill.py",
    "models/demos/gpt_oss/tt/experts_throughput/decode.py",
    "models/demos/llama3_70b_galaxy/tt/llama_ccl.py",
    "models/demos/llama3_70b_galaxy/tt/llama_mlp.py",
    "models/tt_transformers/demo/simple_text_demo.py",
    "models/tt_transformers/tt/attention.py",
    "models/tt_transformers/tt/ccl.py",
    "models/tt_transformers/tt/model_config.py",
    "tt_metal/api/tt-metalium/cluster.hpp",
    "tt_metal/api/tt-metalium/experimental/mock_device.hpp",
    "tt_metal/core_descriptors/blackhole_140_arch.yaml",
    "tt_metal/core_descriptors/wormhole_b0_80_arch.yaml",
    "tt_metal/core_descriptors/wormhole_b0_80_arch_eth_dispatch.yaml",
    "tt_metal/distributed/mesh_buffer.cpp",
    "tt_metal/distributed/mesh_trace.cpp",
    "tt_metal/hw/inc/internal/tt-1xx/blackhole/dev_mem_map.h",
    "tt_metal/hw/inc/internal/tt-1xx/wormhole/dev_mem_map.h",
    "tt_metal/impl/debug/dprint_server.cpp",
    "tt_metal/impl/dispatch/kernel_config/dispatch_s.cpp",
    "tt_metal/llrt/hal/tt-1xx/blackhole/bh_hal.cpp",
    "tt_metal/llrt/hal/tt-1xx/wormhole/wh_hal.cpp",
    "tt_metal/llrt/hal/tt-1xx/wormhole/wh_hal_tensix.cpp",
    "tt_metal/soc_descriptors/blackhole_140_arch.yaml",
    "tt_metal/soc_descriptors/wormhole_b0_80_arch.yaml",
    "ttnn/core/distributed/distributed_tensor.cpp",
    "ttnn/cpp/ttnn/operations/data_movement/permute/device/permute_device_operation.cpp",
    "ttnn/cpp/ttnn/operations/eltwise/binary_ng/device/binary_ng_device_operation.cpp",
    "ttnn/cpp/ttnn/operations/experimental/ccl/all_gather_async/device/all_gather_async_device_operation.cpp",
    "ttnn/cpp/ttnn/operations/experimental/ccl/reduce_scatter_minimal_async/device/reduce_scatter_minimal_async_op_device_operation.cpp",
    "ttnn/cpp/ttnn/operations/experimental/paged_cache/device/fill_cache/paged_fill_cache_device_operation.cpp",
    "ttnn/cpp/ttnn/operations/experimental/paged_cache/device/update_cache/paged_update_cache_device_operation.cpp",
    "ttnn/cpp/ttnn/operations/experimental/transformer/nlp_create_qkv_heads/device/nlp_create_qkv_heads_device_operation.cpp",
    "ttnn/cpp/ttnn/operations/experimental/transformer/nlp_create_qkv_heads/nlp_create_qkv_heads.cpp",
    "ttnn/cpp/ttnn/operations/kv_cache/device/update_cache_device_operation.cpp",
    "ttnn/cpp/ttnn/operations/matmul/device/config/matmul_program_config_types.hpp",
    "ttnn/cpp/ttnn/operations/matmul/device/matmul_device_operation.cpp",
    "ttnn/cpp/ttnn/operations/matmul/device/sparse/factory/sparse_matmul_multicore_reuse_mcast_1d_optimized.cpp",
    "ttnn/cpp/ttnn/operations/matmul/device/sparse/sparse_matmul_device_operation.cpp",
    "ttnn/cpp/ttnn/operations/reduction/topk/device/topk_device_operation.cpp",
    "ttnn/cpp/ttnn/operations/reduction/topk/topk.cpp",
    "ttnn/cpp/ttnn/operations/transformer/chunk_gated_delta_rule/chunk_gated_delta_rule.cpp",
    "ttnn/cpp/ttnn/operations/transformer/sdpa/device/sdpa_device_operation.cpp",
    "ttnn/cpp/ttnn/operations/transformer/sdpa_decode/device/sdpa_decode_device_operation.cpp",
    "ttnn/ttnn/__init__.py",
    "ttnn/ttnn/device.py",
    "ttnn/ttnn/distributed/distributed.py",
]

# tt-metal's top-level folders a citation may start with
TOP_FOLDERS = ("models/", "ttnn/", "tt_metal/", "tt-train/", "tests/", "tech_reports/", "tt_stl/")


def _script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("check_citations", str(SCRIPT))
    spec = importlib.util.spec_from_loader("check_citations", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False
    )


def test_the_list_is_what_the_source_cites() -> None:
    found = sorted(_script().cited(ROOT / "tt_serve"))
    assert found == sorted(CITED), (
        "tt-metal citations changed: add new ones to CITED (once checked against tt-metal), "
        f"drop stale ones; new {sorted(set(found) - set(CITED))}, "
        f"gone {sorted(set(CITED) - set(found))}"
    )


@pytest.mark.parametrize("path", CITED)
def test_each_citation_is_a_tt_metal_file_path(path: str) -> None:
    assert path.startswith(TOP_FOLDERS), f"{path}: not under one of tt-metal's top folders"
    assert not path.startswith("tests/tt/"), f"{path}: tt-serve's own tests, not tt-metal's"
    parts = path.split("/")
    assert "" not in parts and "." not in parts and ".." not in parts, path
    assert "." in parts[-1] and not parts[-1].startswith("."), f"{path}: no file extension"
    assert not any(c in path for c in "{},* \\"), f"{path}: not one plain path"
    # tt_transformers keeps its modules in models/tt_transformers/tt/ (there is no tt/runtime/)
    assert "tt_transformers/tt/runtime" not in path, path
    # ttnn's Python package lives under ttnn/ttnn/ in the repository (ttnn/<module> is the wheel)
    if path.startswith("ttnn/") and path.endswith(".py"):
        assert path.startswith("ttnn/ttnn/"), f"{path}: the wheel's path, not the repository's"


def test_the_citations_exist_in_a_checkout_and_a_missing_one_fails(tmp_path: Path) -> None:
    checkout = tmp_path / "tt-metal"
    for path in CITED:
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        (checkout / path).write_text("")
    ok = _run("--tt-metal", str(checkout))
    assert ok.returncode == 0, ok.stdout + ok.stderr

    gone = "models/tt_transformers/tt/ccl.py"
    (checkout / gone).unlink()
    bad = _run("--tt-metal", str(checkout))
    assert bad.returncode == 1
    assert gone in bad.stdout and "virtual/mesh.py" in bad.stdout
    assert sum("missing in" in line for line in bad.stdout.splitlines()) == 1


def test_expand_and_the_pattern() -> None:
    check = _script()
    assert check.expand("tt_metal/a/{wormhole,blackhole}/x.h") == [
        "tt_metal/a/wormhole/x.h",
        "tt_metal/a/blackhole/x.h",
    ]
    line = (
        "tt-metal:models/a/b.py, tests/tt/mock/test_x.py, /project/ttnn/cpp/x.cpp, "
        "``tt_metal/dir/``, scripts/x.c, ttnn/ttnn/device.py"
    )
    assert [m.group(1) for m in check.CITATION.finditer(line)] == [
        "models/a/b.py",
        "ttnn/ttnn/device.py",
    ]
