"""The precision-cost table ``tt-serve plan`` shows: the committed file is whole and consistent,
merging keeps other shapes, and the plan prints a profile's cost with its provenance."""

from __future__ import annotations

from pathlib import Path

from tt_serve.model.precision import PROFILES
from tt_serve.model.tt.plan import cost_table as ct
from tt_serve.model.tt.plan.planner import Plan
from tt_serve.model.tt.plan.report import format_quality

ROW = {
    "greedy_equal_reference": 0.5,
    "greedy_equal_bfloat16": 0.25,
    "top1": 0.9,
    "top5": 1.0,
    "logprob_drift": {"mean": 0.05, "p99": 0.4, "max": 0.5},
    "greedy_agreeing_prefix": 0.7,  # not a table metric: dropped
}
PROV = {"shape": "qwen3.5-0.8b", "hidden": 1024, "layers": 4, "vocab": 248320, "positions": 128}


def test_the_committed_table_measures_every_profile_at_the_0_8b_and_9b_shapes() -> None:
    table = ct.load_table()
    assert {"qwen3.5-0.8b", "qwen3.5-9b"} <= set(table)
    for shape in table.values():
        assert set(shape.profiles) == set(PROFILES)
        assert {"commit", "layers", "vocab", "positions", "prompts"} <= set(shape.provenance)
        for c in shape.profiles.values():
            assert 0.0 <= c.top1 <= c.top5 <= 1.0
            assert 0.0 <= c.drift_mean <= c.drift_p99 <= c.drift_max


def test_merge_keeps_other_shapes_and_only_the_table_metrics(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    ct.merge_shape(path, "Qwen3.5-0.8B", PROV, {p: ROW for p in PROFILES})
    ct.merge_shape(path, "qwen3.5-9b", PROV | {"hidden": 4096}, {"mixed": ROW})
    table = ct.load_table(path)
    assert set(table) == {"qwen3.5-0.8b", "qwen3.5-9b"}
    assert table["qwen3.5-0.8b"].profiles["mixed"] == ct.ProfileCost(
        0.5, 0.25, 0.9, 1.0, 0.05, 0.4, 0.5
    )
    # a folder's model reads the measured shape of the closest width
    assert ct.nearest(table, "/some/folder", 3584) is table["qwen3.5-9b"]
    assert ct.nearest(table, "QWEN3.5-0.8B", 4096) is table["qwen3.5-0.8b"]
    assert ct.nearest({}, "qwen3.5-9b", 4096) is None


def test_plan_prints_the_cost_of_its_precision(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    ct.merge_shape(path, "qwen3.5-0.8b", PROV | {"commit": "abc"}, {"mixed": ROW})
    costs = ct.load_table(path)["qwen3.5-0.8b"]
    mixed = "\n".join(format_quality(Plan(True, "p150", 1, "blackhole", "mixed"), costs))
    assert "top-1 90.0%" in mixed and "0.050/0.400/0.500" in mixed and "4 layers" in mixed
    other = "\n".join(format_quality(Plan(True, "p150", 1, "blackhole", "bfp4-mlp"), costs))
    assert "bfp4-mlp: not measured" in other
