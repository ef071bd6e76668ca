"""``plan/tiers.py``: where agents' conversations stay warm (device pool, host and disk tiers),
and what a restore from host memory costs over the box's PCIe links."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tt_serve.model.published import published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import BLACKHOLE_LINK, WORMHOLE_LINK, device_spec
from tt_serve.model.tt.options import Target, TTOptions
from tt_serve.model.tt.plan import tiers
from tt_serve.model.tt.plan.planner import Plan, PoolPlan
from tt_serve.model.tt.plan.tiers import AgentShape


def _plan(*, chips: int = 1, kv_blocks: int = 1000, slots: int = 4) -> Plan:
    """A fitting plan with round numbers: 1 MB per KV block and 10 MB per snapshot, per chip."""
    pools = PoolPlan(kv_blocks, 64, 8, slots, 0)
    return Plan(
        ok=True,
        device="p150",
        chips=chips,
        chip="blackhole",
        precision="bfloat16",
        pools=pools,
        kv_blocks=kv_blocks,
        kv_tokens=(kv_blocks - 1) * 64,
        kv_bytes=kv_blocks * 1_000_000,
        snapshot_bytes=slots * 10_000_000,
        max_context=(kv_blocks - 1) * 64,
    )


def test_agent_shapes_parse_and_refuse() -> None:
    assert AgentShape.parse("8x128k") == AgentShape(8, 131072)
    assert AgentShape.parse("4x262144") == AgentShape(4, 262144)
    assert str(AgentShape(8, 131072)) == "8 x 128k"
    for bad in ("8", "8y128k", "0x4k", "x4k", "2x-1"):
        with pytest.raises(ValueError, match="agent shape"):
            AgentShape.parse(bad)


def test_pcie_line_rates() -> None:
    # 16 / 32 GT/s per lane, 128b/130b coding, 16 lanes
    assert WORMHOLE_LINK.peak_gbps == pytest.approx(31.51, abs=0.01)
    assert BLACKHOLE_LINK.peak_gbps == pytest.approx(63.02, abs=0.01)
    assert device_spec("t3k").host_link is not None and device_spec("t3k").host_link.links == 4


def test_a_conversation_is_its_blocks_and_one_snapshot() -> None:
    p = _plan(kv_blocks=1000, slots=4)
    board = device_spec("p150")
    shape = AgentShape(8, 100 * 64 + 1)  # 101 blocks
    f = tiers.fit(p, board, 64, shape, host_gb=1.0, disk_gb=0.5)
    assert f.kv_bytes == 101_000_000 and f.snapshot_bytes == 10_000_000
    assert f.agent_bytes == 111_000_000
    # the pool holds 9 such KV spans but only 4 snapshot slots: 4 conversations
    assert f.device == 4
    assert f.host == 9 and f.disk == 4  # 2^30 // 111e6, 2^29 // 111e6
    # inclusive tiers (written through): the most one tier holds, not the sum
    assert f.held == 9 and f.fits and f.tier_bytes == 8 * 111_000_000
    assert f.restore_peak_s == pytest.approx(111e6 / (BLACKHOLE_LINK.peak_gbps * 1e9))
    assert f.restore_measured_s is None  # tt-metal published no Blackhole figure
    small = tiers.fit(p, board, 64, shape)
    assert (small.host, small.disk, small.fits) == (0, 0, False)


def test_the_device_pool_bounds_by_blocks_too() -> None:
    f = tiers.fit(_plan(kv_blocks=250, slots=32), device_spec("p150"), 64, AgentShape(4, 64 * 100))
    assert f.device == 2  # 250 // 100 blocks
    too_long = tiers.fit(_plan(kv_blocks=50), device_spec("p150"), 64, AgentShape(1, 64 * 100))
    assert not too_long.runs and not too_long.fits


def test_replicated_kv_heads_are_kept_once_and_links_share_chips() -> None:
    """Qwen3.5-27B on a T3K: 4 KV heads over 8 columns, each head on two chips; the host keeps
    4 shards of KV and 8 of GDN state, and each of the 4 links carries two chips' shares."""
    spec = ModelSpec.from_config(published_config("qwen3.5-27b"))
    board = device_spec("t3k")
    target = Target.of(spec, board, TTOptions())
    p = _plan(chips=8, kv_blocks=3000, slots=32)
    (f,) = tiers.fits(p, target, 64, [AgentShape(2, 64 * 1000)])
    assert spec.num_kv_heads == 4 and target.tp.kv_heads == 1
    assert f.kv_bytes == 4 * 1000 * 1_000_000  # 4 distinct shards, not 8 chips
    assert f.snapshot_bytes == 8 * 10_000_000
    per_link = 2 * (1000 * 1_000_000 + 10_000_000)
    assert f.restore_peak_s == pytest.approx(per_link / (WORMHOLE_LINK.peak_gbps * 1e9))
    assert f.restore_measured_s == pytest.approx(per_link / 3.9e9)


@pytest.mark.slow
def test_plan_prints_the_tiers_of_the_target_shapes() -> None:
    """The 0.8B shape on a p150 with a pool of 64 blocks: 2 agents x 2k fit the device, the
    third needs the host tier; the JSON and the text agree."""
    cmd = [sys.executable, "-m", "tt_serve.cli", "plan", "--model", "qwen3.5-0.8b"]
    args = ["--device", "p150", "--max-batch-size", "1", "--kv-blocks", "64"]
    args += ["--checker", "virtual", "--agents", "3x2k,1x64k", "--host-cache-gb", "1"]
    run = subprocess.run([*cmd, *args, "--json"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    two, long = doc["tiers"]
    assert two["shape"] == {"agents": 3, "context": 2048} and two["fits"]
    blocks = math.ceil(2048 / 64)
    assert two["device"] == min(doc["kv_blocks"] // blocks, doc["pools"]["num_snapshot_slots"])
    assert two["kv_bytes"] == doc["kv_bytes"] * blocks // doc["kv_blocks"]
    assert two["host"] == int(2**30 // two["agent_bytes"])  # GiB, as the server counts
    assert not long["runs"] and not long["fits"]  # 64k > the 64-block pool
    text = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=600)
    assert "tiers        3 x 2k: one conversation" in text.stdout
    assert "65536 tokens exceed the device's max context" in text.stdout
    bad = subprocess.run([*cmd, *args, "--agents", "3y2k"], capture_output=True, text=True)
    assert bad.returncode == 2 and "agent shape '3y2k'" in bad.stderr
