"""tt-umd cluster descriptors (YAML) for the boxes in ``boards.DEVICES`` (stdlib only, no ttnn).

tt-metal opens a *mock* box (no card) from such a file: ``TT_METAL_MOCK_CLUSTER_DESC_PATH=<path>``
(``tt_metal/api/tt-metalium/experimental/mock_device.hpp``). ``cluster_descriptor(board)`` writes
one from our own table, so what tt-metal then reports (cluster type, grid, DRAM and L1 banks) can
be held against that table (``tests/tt/mock/test_boards.py``). Nothing here is copied from a
third-party file; the format and the values are read from these public sources (paths are
repository-relative, tt-umd and tt-metal snapshots of 2025-2026):

* Format: tt-umd ``device/cluster_descriptor.cpp`` (``load_chips_from_connectivity_descriptor``,
  ``load_ethernet_connections_from_connectivity_descriptor``, ``load_harvesting_information``):
  ``arch`` (chip -> arch), ``chips`` (chip -> [x, y, rack, shelf], Wormhole only),
  ``ethernet_connections`` (pairs of {chip, chan}), ``chips_with_mmio`` (chip -> PCIe device),
  ``harvesting`` (chip -> noc_translation and masks), ``chip_to_boardtype``, ``asic_locations``,
  ``boards`` ([{board_id}, {board_type}, {chips}]). Examples: tt-umd
  ``tests/cluster_descriptor_examples/`` (wormhole_N150, wormhole_N300, blackhole_P100,
  blackhole_P150, blackhole_P300_both_mmio, blackhole_4xP150, blackhole_8xP150,
  6u_cluster_desc) and tt-metal ``tests/tt_metal/tt_fabric/custom_mock_cluster_descriptors/``
  (t3k_cluster_desc).
* Board ids: tt-umd ``device/api/umd/device/types/cluster_descriptor_types.hpp``
  ``get_board_type_from_board_id`` reads the board type from bits 36..55 of ``board_id`` (the
  UPI: n150 0x18, n300 0x14, p100 0x36, p150 0x40, p300 0x44, Wormhole UBB 0x35, Blackhole UBB
  0x47); ``verify_board_info_for_chips`` requires each board to hold
  ``get_number_of_chips_from_board_type`` chips (n300 and p300 2, UBB 32, others 1). A
  board_id without a known UPI aborts the open ("No existing board type for board ID").
* Harvesting: ``expected_tensix_harvested_units_map`` / ``expected_dram_harvested_units_map`` /
  ``expected_eth_harvested_units_map`` in the same header (N150 1 tensix row, N300 2, P100/P150/
  P300 2 tensix columns, Wormhole UBB 0, Blackhole UBB 1; P100 1 DRAM channel; P150/P300/
  Blackhole UBB 2 ethernet cores, P100 all 14). The count comes from our table (enabled Tensix,
  DRAM banks); which bits are set follows the examples (Blackhole ``harvest_mask: 192`` = columns
  6 and 7 on the P150, ``eth_harvesting_mask: 288``, ``pcie_harvesting_mask: 2``, P100
  ``dram_harvesting_mask: 8`` and ``eth_harvesting_mask: 16383``; Wormhole rows from bit 0).
* Ethernet topology: the system mesh tt-metal's control plane expects for each cluster type,
  ``tt_metal/fabric/mesh_graph_descriptors/{n300,t3k,p300,p150_x4,p150_x8,single_galaxy,
  single_bh_galaxy}_mesh_graph_descriptor.textproto`` (``device_topology`` 1x2, 2x4, 1x2, 2x2,
  2x4, 8x4, 8x4; ``channels { count: 2 | 4 }`` per neighbour pair). The N300 in-board link is
  local channels 8/9 to remote channels 0/1 (tt-umd wormhole_N300); the P300 in-board link is
  chip 0 channels 2/3 to chip 1 channels 9/8 (tt-umd blackhole_P300_both_mmio).

Not written: the galaxies (``galaxy``, ``bh_galaxy``); ``cluster_descriptor`` raises ValueError
for them. Tried with ttnn 0.81.1: a 32-chip UBB descriptor (one ``ubb`` / ``ubb_blackhole`` board,
8x4 ethernet grid, trays and ASIC positions in ``chip_to_bus_id`` as tt-metal's ``get_ubb_id``
decodes them) is recognised (``ttnn.cluster.get_cluster_type()`` GALAXY / BLACKHOLE_GALAXY), but
every open, ``open_device`` included, stops in the control plane: "SAT placement: mesh 'M0' (mesh
0) has no grouping in the provided valid-groupings map" (physical_grouping_descriptor_matching.cpp)
after "No Physical Grouping Descriptor file found" (it looks for tt-metal's
``tests/tt_metal/tt_fabric/physical_groupings/*.textproto``, which the wheel does not ship).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tt_serve.model.tt.boards import DEVICES, DeviceSpec

# Boards tt-metal 0.81.1 opens as a mock from ``cluster_descriptor`` (tests/tt/mock/test_boards.py).
MOCK_BOARDS: tuple[str, ...] = ("n150", "n300", "t3k", "p100", "p150", "p300", "p150x4", "p150x8")

# tt-umd cluster_descriptor_types.hpp board_upi_map (one UPI per board type is enough here).
_UPI = {"n150": 0x18, "n300": 0x14, "p100": 0x36, "p150": 0x40, "p300": 0x44}
# Chips per board (get_number_of_chips_from_board_type).
_CHIPS_PER_BOARD = {"n150": 1, "n300": 2, "p100": 1, "p150": 1, "p300": 2}

# Die sizes (Tensix): Wormhole 8 columns x 10 rows, harvested by row; Blackhole 14 columns x 10
# rows, harvested by column (tt_metal/soc_descriptors/{wormhole_b0_80,blackhole_140}_arch.yaml).
_WH_TENSIX_PER_ROW = 8
_WH_ROWS = 10
_BH_TENSIX_PER_COL = 10
_BH_COLS = 14
# Blackhole: 8 GDDR6 channels, 14 ethernet cores (blackhole_140_arch.yaml).
_BH_DRAM_CHANNELS = 8
# Blackhole column bits to harvest, in order (P150 example: 192 = columns 6, 7).
_BH_HARVEST_COLUMNS = (6, 7, 5, 8)
# Blackhole DRAM channel bits to harvest, in order (P100 example: 8 = channel 3).
_BH_HARVEST_DRAM = (3, 2, 4, 1)
# Blackhole ethernet masks per board type (P150/P300 examples 288; P100 all 14 cores).
_BH_ETH_MASK = {"p100": (1 << 14) - 1, "p150": 288, "p300": 288}
# Ethernet channels a generic link takes, in order (Blackhole examples wire 4..11 between P150s).
_BH_LINK_CHANNELS = (4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3)


@dataclass(frozen=True)
class _Box:
    """How a table entry is built: ``boards`` boards of ``board_type``; the system mesh
    (rows, cols) and ``links`` ethernet channels between neighbours."""

    board_type: str
    boards: int
    system: tuple[int, int]
    links: int


# name -> box (system mesh and links per neighbour pair from the mesh graph descriptors above)
_BOXES: dict[str, _Box] = {
    "n150": _Box("n150", 1, (1, 1), 0),
    "n300": _Box("n300", 1, (1, 2), 2),
    "t3k": _Box("n300", 4, (2, 4), 2),
    "p100": _Box("p100", 1, (1, 1), 0),
    "p150": _Box("p150", 1, (1, 1), 0),
    "p300": _Box("p300", 1, (1, 2), 2),
    "p150x4": _Box("p150", 4, (2, 2), 4),
    "p150x8": _Box("p150", 8, (2, 4), 2),
}

_Link = tuple[int, int, int, int]  # chip a, channel a, chip b, channel b


def _low_bits(n: int) -> int:
    return (1 << n) - 1


def _bits(order: tuple[int, ...], n: int) -> int:
    if n > len(order):
        raise ValueError(f"cannot harvest {n} units (at most {len(order)})")
    return sum(1 << b for b in order[:n])


def _harvest(board: DeviceSpec, box: _Box, chip: int) -> dict[str, int]:
    c = board.chip
    if c.arch == "wormhole_b0":
        rows = _WH_ROWS - c.enabled_tensix // _WH_TENSIX_PER_ROW
        if c.enabled_tensix % _WH_TENSIX_PER_ROW or rows < 0:
            raise ValueError(f"{board.name}: {c.enabled_tensix} Tensix is not whole Wormhole rows")
        return {"harvest_mask": _low_bits(rows)}
    cols = _BH_COLS - c.enabled_tensix // _BH_TENSIX_PER_COL
    if c.enabled_tensix % _BH_TENSIX_PER_COL or cols < 0:
        raise ValueError(f"{board.name}: {c.enabled_tensix} Tensix is not whole Blackhole columns")
    # P300: the second chip is the PCIe "type 1" ASIC (tt-umd get_blackhole_chip_type), which
    # the P300 example gives pcie_harvesting_mask 1; every other Blackhole chip 2.
    pcie = 1 if box.board_type == "p300" and chip % 2 else 2
    return {
        "harvest_mask": _bits(_BH_HARVEST_COLUMNS, cols),
        "dram_harvesting_mask": _bits(_BH_HARVEST_DRAM, _BH_DRAM_CHANNELS - c.dram_banks),
        "eth_harvesting_mask": _BH_ETH_MASK[box.board_type],
        "pcie_harvesting_mask": pcie,
        "l2cpu_harvesting_mask": 0,
    }


def _grid_links(rows: int, cols: int, links: int, order: tuple[int, ...]) -> list[_Link]:
    """Chip r*cols+c at (r, c), ``links`` channels to its east and south neighbours, each chip
    taking its channels in ``order``."""
    used: dict[int, int] = {}
    out: list[_Link] = []

    def take(chip: int) -> int:
        i = used.get(chip, 0)
        used[chip] = i + 1
        return order[i]

    for r in range(rows):
        for c in range(cols):
            a = r * cols + c
            for b in ([a + 1] if c + 1 < cols else []) + ([a + cols] if r + 1 < rows else []):
                out += [(a, take(a), b, take(b)) for _ in range(links)]
    return out


def _t3k_links() -> tuple[list[_Link], dict[int, tuple[int, int]]]:
    """Four N300 boards as a 2x4 mesh. Board k: local (PCIe) chip k, remote chip 4+k, joined by
    local channels 8/9 to remote 0/1. Boards 0 and 1 take columns 0-1 (remote left), boards 2
    and 3 columns 2-3 (remote right); boards 0 and 2 row 0, boards 1 and 3 row 1. Locals link
    along a row on channels 6/7 and down a column on 14/15, remotes down a column on 6/7."""
    pos = {}
    for k in range(4):
        row, right = k % 2, k >= 2
        pos[k] = (2 if right else 1, row)  # (x, y)
        pos[4 + k] = (3 if right else 0, row)
    links: list[_Link] = []
    for k in range(4):
        links += [(k, 8, 4 + k, 0), (k, 9, 4 + k, 1)]  # in-board
    links += [(0, 6, 2, 6), (0, 7, 2, 7), (1, 6, 3, 6), (1, 7, 3, 7)]  # locals, along rows
    links += [(0, 14, 1, 14), (0, 15, 1, 15), (2, 14, 3, 14), (2, 15, 3, 15)]  # locals, down
    links += [(4, 6, 5, 6), (4, 7, 5, 7), (6, 6, 7, 6), (6, 7, 7, 7)]  # remotes, down
    return links, pos


def _layout(board: DeviceSpec, box: _Box) -> tuple[list[_Link], dict[int, tuple[int, int]]]:
    """Ethernet links and Wormhole chip coordinates (x, y) for ``board``."""
    if board.name == "t3k":
        return _t3k_links()
    rows, cols = box.system
    pos = {r * cols + c: (c, r) for r in range(rows) for c in range(cols)}
    if box.board_type == "n300":
        return [(0, 8, 1, 0), (0, 9, 1, 1)], pos
    if box.board_type == "p300":
        return [(0, 2, 1, 9), (0, 3, 1, 8)], pos
    return _grid_links(rows, cols, box.links, _BH_LINK_CHANNELS), pos


def _board_chips(box: _Box) -> list[list[int]]:
    """Chips of each board. Wormhole N300 boards: local chip k with remote chip boards+k (the
    remote chips are numbered after every PCIe chip, as tt-umd numbers them)."""
    if box.board_type == "n300":
        return [[k, box.boards + k] for k in range(box.boards)]
    per = _CHIPS_PER_BOARD[box.board_type]
    return [list(range(b * per, (b + 1) * per)) for b in range(box.boards)]


def cluster_descriptor(board: DeviceSpec) -> str:
    """The tt-umd cluster descriptor YAML of ``board``'s whole box (every chip of its mesh).
    Raises ValueError for a board ttnn 0.81.1 does not open as a mock (see MOCK_BOARDS)."""
    box = _BOXES.get(board.name)
    if box is None:
        raise ValueError(
            f"no mock cluster descriptor for {board.name!r} (written for: {', '.join(MOCK_BOARDS)})"
        )
    per = _CHIPS_PER_BOARD[box.board_type]
    n = box.boards * per
    if n != board.num_chips:
        raise ValueError(f"{board.name}: {n} chips in the box, {board.num_chips} in the table")
    arch = board.chip.arch
    wormhole = arch == "wormhole_b0"
    links, pos = _layout(board, box)
    boards = _board_chips(box)
    # N300: only the local chip of each board has PCIe; every Blackhole chip has its own.
    mmio = [b[0] for b in boards] if box.board_type == "n300" else list(range(n))

    lines = ["arch:"] + [f"  {c}: {arch}" for c in range(n)]
    if wormhole:
        lines.append("chips:")
        lines += [f"  {c}: [{pos[c][0]}, {pos[c][1]}, 0, 0]" for c in range(n)]
    else:
        lines.append("chips: {}")
    if links:
        lines.append("ethernet_connections:")
        for a, ca, b, cb in links:
            lines += [
                f"  - - chip: {a}",
                f"      chan: {ca}",
                f"    - chip: {b}",
                f"      chan: {cb}",
            ]
    else:
        lines.append("ethernet_connections: []")
    lines.append("ethernet_connections_to_remote_devices: []")
    lines.append("chips_with_mmio:")
    lines += [f"  - {c}: {i}" for i, c in enumerate(mmio)]
    lines.append("harvesting:")
    for c in range(n):
        lines += [f"  {c}:", "    noc_translation: true"]
        lines += [f"    {k}: {v}" for k, v in _harvest(board, box, c).items()]
    lines.append("chip_to_boardtype:")
    lines += [f"  {c}: {box.board_type}" for c in range(n)]
    if box.board_type == "p300":  # which ASIC of the card (tt-umd get_blackhole_chip_type)
        lines.append("asic_locations:")
        lines += [f"  {c}: {b.index(c)}" for b in boards for c in b]
    lines.append("boards:")
    for i, chips in enumerate(boards):
        board_id = (_UPI[box.board_type] << 36) | (0x1000 + i)
        lines += [
            f"  - - board_id: {board_id}",
            f"    - board_type: {box.board_type}",
            f"    - chips: [{', '.join(map(str, chips))}]",
        ]
    return "\n".join(lines) + "\n"


def write_cluster_descriptor(board: DeviceSpec, folder: Path | str) -> Path:
    """Write ``cluster_descriptor(board)`` to ``folder/<name>_cluster_desc.yaml``; returns the
    absolute path (what TT_METAL_MOCK_CLUSTER_DESC_PATH needs)."""
    path = Path(folder).resolve() / f"{board.name}_cluster_desc.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cluster_descriptor(board))
    return path


def mock_boards() -> list[DeviceSpec]:
    """The table entries ``cluster_descriptor`` writes, in MOCK_BOARDS order."""
    return [DEVICES[name] for name in MOCK_BOARDS]
