"""Device descriptions (tt_serve.model.tt.boards): the registry users pick from, and the numbers
the planner relies on, pinned to what tt-metal states (see the citations in boards.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tt_serve.model.tt import boards
from tt_serve.model.tt.boards import DEVICES, DeviceSpec, device_spec

GIB = 1 << 30

# name -> (arch, mesh, grid per chip, DRAM bytes per chip)
EXPECTED: dict[str, tuple[str, tuple[int, int], tuple[int, int], int]] = {
    "n150": ("wormhole_b0", (1, 1), (8, 8), 12 * GIB),
    "n300": ("wormhole_b0", (1, 2), (8, 8), 12 * GIB),
    "t3k": ("wormhole_b0", (1, 8), (8, 8), 12 * GIB),
    "galaxy": ("wormhole_b0", (8, 4), (8, 9), 12 * GIB),
    "p100": ("blackhole", (1, 1), (11, 10), 7 * 4_278_190_080),
    "p150": ("blackhole", (1, 1), (11, 10), 8 * 4_278_190_080),
    "p300": ("blackhole", (1, 2), (11, 10), 8 * 4_278_190_080),
    "p150x4": ("blackhole", (1, 4), (11, 10), 8 * 4_278_190_080),
    "p150x8": ("blackhole", (1, 8), (11, 10), 8 * 4_278_190_080),
    "bh_galaxy": ("blackhole", (8, 4), (12, 10), 8 * 4_278_190_080),
}


def test_registry_has_every_deployed_sku() -> None:
    required = {"n150", "n300", "p150", "p300", "t3k", "p150x4", "galaxy"}
    assert required <= set(DEVICES)
    assert set(DEVICES) == set(EXPECTED)
    for name, spec in DEVICES.items():
        assert spec.name == name
        assert isinstance(spec, DeviceSpec)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_spec_numbers(name: str) -> None:
    arch, mesh, (gx, gy), dram = EXPECTED[name]
    spec = device_spec(name)
    assert spec.chip.arch == arch
    assert spec.mesh == mesh
    assert (spec.chip.grid_x, spec.chip.grid_y) == (gx, gy)
    assert spec.chip.num_cores == gx * gy
    assert spec.chip.dram_bytes == dram
    assert spec.chip.dram_bank_bytes * spec.chip.dram_banks == dram
    # tensix dispatch takes a row/column of the enabled Tensix; ethernet dispatch takes none
    if spec.dispatch == "eth":
        assert spec.chip.num_cores == spec.chip.enabled_tensix
    else:
        assert spec.chip.num_cores < spec.chip.enabled_tensix
    assert 0 < spec.chip.dram_reserved_bytes < spec.chip.dram_bytes
    assert spec.chip.usable_dram_bytes == dram - spec.chip.dram_reserved_bytes
    assert 0 < spec.chip.l1_firmware_reserved_bytes < spec.chip.l1_bytes
    assert spec.dispatch in {"worker-row", "worker-col", "eth"}
    for other in spec.other_meshes:
        assert other[0] * other[1] == spec.num_chips


def test_core_counts_per_chip() -> None:
    # Wormhole: 8x8 = 64 on N150 (tensix row dispatch) and N300/T3K (ethernet dispatch).
    for name in ("n150", "n300", "t3k"):
        assert device_spec(name).chip.num_cores == 64
    # Wormhole Galaxy: unharvested 8x10, one row to dispatch -> 8x9.
    assert device_spec("galaxy").chip.num_cores == 72
    # Blackhole p1xx/p300: 14 columns - 2 harvested - 1 dispatch = 11 x 10 rows.
    for name in ("p100", "p150", "p300", "p150x4", "p150x8"):
        assert device_spec(name).chip.num_cores == 110
    assert device_spec("bh_galaxy").chip.num_cores == 120


def test_chips_per_box() -> None:
    chips = {name: device_spec(name).num_chips for name in EXPECTED}
    assert chips == {
        "n150": 1,
        "n300": 2,
        "t3k": 8,
        "galaxy": 32,
        "p100": 1,
        "p150": 1,
        "p300": 2,
        "p150x4": 4,
        "p150x8": 8,
        "bh_galaxy": 32,
    }


def test_memory_per_chip() -> None:
    wh, bh = device_spec("n150").chip, device_spec("p150").chip
    assert wh.l1_bytes == 1_499_136  # 1464 KiB
    assert bh.l1_bytes == 1_572_864  # 1536 KiB
    assert wh.dram_banks == 12 and wh.dram_bank_bytes == GIB
    assert bh.dram_banks == 8 and bh.dram_bank_bytes == 4 * GIB - 16 * (1 << 20)
    assert device_spec("p100").chip.dram_banks == 7
    # HAL regions per bank: barrier word + DPRINT dispatch ring (1 MiB + one DRAM_ALIGNMENT),
    # the allocator DRAM base ttnn 0.81.1 reports under mock (tests/tt/mock/test_boards.py)
    assert wh.dram_reserved_bytes == 12 * 1_048_640
    assert bh.dram_reserved_bytes == 8 * 1_048_704
    # allocator L1 bank: MEM_MAP_END and the 69 KiB kernel-config buffer below it
    assert wh.l1_bank_bytes == 1_393_312
    assert bh.l1_bank_bytes == 1_461_120
    # every chip of a box is the board's chip
    assert device_spec("t3k").chip == device_spec("n300").chip
    for name in ("p300", "p150x4", "p150x8"):
        assert device_spec(name).chip == bh


def test_lookup_is_case_insensitive() -> None:
    assert device_spec("P150x4") is DEVICES["p150x4"]
    assert device_spec(" T3K ") is DEVICES["t3k"]


@pytest.mark.parametrize("bad", ["n200", "", "p150x2", "wormhole"])
def test_unknown_name_raises_naming_the_known_ones(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        device_spec(bad)
    msg = str(info.value)
    assert repr(bad) in msg
    for name in DEVICES:
        assert name in msg


def test_specs_are_frozen() -> None:
    spec = device_spec("p150")
    with pytest.raises(AttributeError):
        spec.mesh = (2, 2)  # type: ignore[misc]


def test_module_imports_without_ttnn() -> None:
    assert "ttnn" not in boards.__dict__
    # a fresh interpreter in which any ttnn import would fail
    code = (
        "import sys\n"
        "sys.modules['ttnn'] = None\n"
        "import tt_serve.model.tt.boards as d\n"
        "assert 'ttnn' not in {m.split('.')[0] for m in sys.modules if sys.modules[m]}\n"
        "print(len(d.DEVICES))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(len(DEVICES))


def test_a_cluster_type_names_its_box_and_links() -> None:
    """How a start identifies its hardware: the ClusterType ttnn reports before anything
    opens names one box, whose links the collectives use; an unknown type is refused by name."""
    from tt_serve.model.tt.boards import DEVICES, board_for_cluster

    assert board_for_cluster("P150_X4").name == "p150x4"
    assert board_for_cluster("P300").name == "p300"
    assert board_for_cluster("P100").name == "p100" and board_for_cluster("P150").name == "p150"
    t3k = board_for_cluster("T3K")
    assert t3k.name == "t3k" and t3k.links_on((2, 4)) == (1, 1)
    assert board_for_cluster("TG").links_on((8, 4)) == (4, 3)
    assert all(d.cluster_types for d in DEVICES.values())
    with pytest.raises(ValueError, match=r"no device description for cluster type 'CUSTOM'"):
        board_for_cluster("CUSTOM")
