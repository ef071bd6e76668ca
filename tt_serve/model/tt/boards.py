"""Descriptions of the Tenstorrent boards and boxes users deploy on (no ttnn import).

Each number is cited from tt-metal (or Tenstorrent's published specifications where tt-metal
has no file for it) in a comment next to it. The device model (op rules, DRAM and trace-region
accounting) and ``tt-serve plan`` read these; nothing here talks to a device.

Sources, all public GitHub; paths are repository-relative (read in tt-metal and tt-umd
snapshots from 2025-2026; line numbers drift, so the key or define that states each number is
named instead):

* ``tt_metal/core_descriptors/wormhole_b0_80_arch.yaml``,
  ``tt_metal/core_descriptors/wormhole_b0_80_arch_eth_dispatch.yaml`` and
  ``tt_metal/core_descriptors/blackhole_140_arch.yaml``: ``compute_with_storage_grid_range``
  per product (``nebula_x1`` = 1 harvested tensix row, ``nebula_x2`` = 2 rows, ``galaxy`` = 0
  rows on Wormhole; ``unharvested`` / ``1xharvested`` / ``2xharvested`` tensix columns on
  Blackhole), per dispatch axis (``row`` / ``col``) and dispatch core type (tensix or
  ethernet). This is what ``device.compute_with_storage_grid_size()`` returns.
* ``tt-umd/device/api/umd/device/types/cluster_descriptor_types.hpp``:
  ``expected_tensix_harvested_units_map`` (which product each board is: N150 1, N300 2, P100 2,
  P150 2, P300 2, UBB (Wormhole Galaxy) 0, UBB_BLACKHOLE 1) and
  ``expected_dram_harvested_units_map`` (P100 1, every other board 0).
* ``tt-metal/ttnn/ttnn/device.py``: ``get_default_dispatch_core_type()`` (ETH for cluster types
  N300, T3K, N300_2x2, else WORKER) and ``get_default_dispatch_core_axis()`` (COL on Blackhole,
  ROW elsewhere): the dispatch configuration a plain ``ttnn.open_mesh_device`` gets, hence the
  grid these specs record.
* ``tt-metal/tt_metal/hw/inc/internal/tt-1xx/{wormhole,blackhole}/dev_mem_map.h``:
  ``MEM_L1_SIZE``, ``MEM_DRAM_SIZE`` (per DRAM bank), ``MEM_MAP_END`` (firmware-reserved L1,
  evaluated from the header the 0.81.1 wheel ships); cross-checked against
  ``tt_metal/soc_descriptors/{wormhole_b0_80_arch,blackhole_140_arch}.yaml`` (``worker_l1_size``,
  ``dram_view_size``, ``dram_bank_size``, ``dram``/``dram_views`` lists).
* ``tt_metal/llrt/hal/tt-1xx/wormhole/wh_hal.cpp`` and
  ``tt_metal/llrt/hal/tt-1xx/blackhole/bh_hal.cpp``: the HAL's DRAM regions at the bottom of
  every bank (``HalDramMemAddrType``): ``DRAM_BARRIER_SIZE`` (one ``DRAM_ALIGNMENT``, 32 B on
  Wormhole, 64 B on Blackhole), a profiler region in Tracy builds only, and in 0.81.1 the
  ``DEVICE_PRINT_DISPATCH`` region (see ``WH_DRAM_RESERVED_PER_BANK``).
  ``{wh,bh}_hal_tensix.cpp`` ``create_tensix_mem_map``: the kernel-config buffer above
  ``MEM_MAP_END`` (``default_l1_kernel_config_size``).
* What ttnn 0.81.1 itself reports for each board, opened as a mock from
  ``plan/cluster_desc.py`` (tests/tt/mock/test_boards.py holds this table to it): cluster
  type, chips, grid, DRAM banks and bank size, L1 banks and bank size.
* ``tt-metal/models/tt_transformers/tt/model_config.py``: ``determine_device_name()`` (N150,
  N300, N150x4, T3K, TG; P100 (DRAM grid 7x1), P150 (8x1), P300, P150x4, P150x8, BHGLX) and the
  ``MESH_DEVICE`` -> ``MeshShape`` tables in tt-metal's demos/tests (e.g.
  ``models/tt_transformers/demo/simple_text_demo.py``): N150 (1,1), N300 (1,2), T3K (1,8),
  TG (8,4), P150 (1,1), P300 (1,2), P150x4 (1,4), P150x8 (1,8), BHGLX (8,4).

What the numbers do not cover (the planner must keep a margin):

* DRAM: beyond the HAL's regions (``dram_reserved_bytes``), ``trace_region_size`` (a
  device-open parameter) is carved out of the top of the banks (0.81.1, measured under mock:
  ``ceil(trace_region_size / banks)`` rounded up to 8 KiB in EVERY bank), and the allocator needs
  headroom (alignment, fragmentation, per-bank interleaving); size that in the planner.
* L1: the allocator's L1 bank is ``l1_bytes - l1_firmware_reserved_bytes -
  l1_kernel_config_bytes`` (``ChipSpec.l1_bank_bytes``, with the default ``worker_l1_size`` of
  0), less ``l1_small_size`` when the device is opened with one.
* Grid: a non-default dispatch configuration changes it (N300/T3K with tensix dispatch lose a
  row: 8x7; Galaxy with column dispatch: 7x10; Blackhole with fabric tensix MUX goes to row
  dispatch), and ``TT_METAL_CORE_GRID_OVERRIDE_TODEPRECATE`` can shrink it further.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class ChipSpec:
    """One chip as ttnn sees it: the worker (compute-with-storage) grid ops can use, its DRAM,
    and the L1 per worker core."""

    arch: str  # "wormhole_b0" | "blackhole"
    grid_x: int  # compute_with_storage_grid_size().x
    grid_y: int  # compute_with_storage_grid_size().y
    dram_bytes: int  # device DRAM per chip, as the allocator sees it (banks x bank size)
    l1_bytes: int  # L1 SRAM per worker core
    dram_banks: int = 0  # interleaving banks (dram_grid_size().x on Blackhole; 12 on Wormhole)
    dram_reserved_bytes: int = 0  # DRAM the HAL reserves per chip (all banks together)
    l1_firmware_reserved_bytes: int = 0  # bottom of each worker's L1 held by firmware/mailboxes
    l1_kernel_config_bytes: int = 0  # kernel-config buffer above it (default worker_l1_size)
    enabled_tensix: int = 0  # Tensix cores left after harvesting, dispatch cores included

    @property
    def num_cores(self) -> int:
        return self.grid_x * self.grid_y

    @property
    def dram_bank_bytes(self) -> int:
        return self.dram_bytes // self.dram_banks if self.dram_banks else self.dram_bytes

    @property
    def l1_bank_bytes(self) -> int:
        """The allocator's L1 bank per worker core with ``l1_small_size`` 0 (the bank shrinks by
        ``l1_small_size`` when one is given)."""
        return self.l1_bytes - self.l1_firmware_reserved_bytes - self.l1_kernel_config_bytes

    @property
    def usable_dram_bytes(self) -> int:
        """DRAM left after the HAL's reservation; trace region and headroom still to subtract."""
        return self.dram_bytes - self.dram_reserved_bytes


@dataclass(frozen=True)
class HostLink:
    """The PCIe links between the host and a board or box: what a restore of cached KV and GDN
    state from host memory crosses (``plan/tiers.py``).

    Peak per direction: PCIe 4.0 runs 16 GT/s and 5.0 32 GT/s per lane with 128b/130b coding,
    1.97 and 3.94 GB/s per lane (PCI-SIG base specifications 4.0 and 5.0). The generation and
    lanes are Tenstorrent's product specifications (n150/n300: PCIe 4.0 x16; p100/p150/p300:
    PCIe 5.0 x16); tt-metal issue #40832 confirms Gen5 x16 for every device of a Blackhole LoudBox. Chips
    that have no link of their own (an n300's second chip, over ethernet) share their card's.
    ``measured_gbps``: what tt-metal itself measured host -> device where it published a figure
    (Wormhole: ``EnqueueWriteBuffer`` of 512 MB to DRAM at 3.9 GB/s, ``test_rw_buffer``,
    tt-metal PR #7759), 0 where it has none."""

    generation: int  # PCIe generation (4, 5)
    lanes: int  # per link
    links: int  # PCIe-attached links of the box (one per card, or per chip where each has one)
    measured_gbps: float = 0.0

    @property
    def peak_gbps(self) -> float:
        """GB/s per direction per link at the link's line rate (after 128b/130b coding)."""
        gts = {3: 8.0, 4: 16.0, 5: 32.0}[self.generation]
        return gts * 128 / 130 / 8 * self.lanes

    def describe(self) -> str:
        many = f"{self.links} x " if self.links > 1 else ""
        return f"{many}PCIe {self.generation}.0 x{self.lanes}"


WORMHOLE_LINK = HostLink(generation=4, lanes=16, links=1, measured_gbps=3.9)
BLACKHOLE_LINK = HostLink(generation=5, lanes=16, links=1)


@dataclass(frozen=True)
class DeviceSpec:
    """A board or a box: ``chips`` identical chips arranged as a ``mesh`` (rows, cols)."""

    name: str
    chip: ChipSpec
    mesh: tuple[int, int]
    dispatch: str = ""  # ttnn's default dispatch: "worker-row" | "worker-col" | "eth"
    other_meshes: tuple[tuple[int, int], ...] = field(default=())  # other shapes tt-metal opens
    description: str = ""
    # Ethernet links a collective uses between neighbours, per mesh axis (axis 0, axis 1)
    # (models/tt_transformers/tt/ccl.py get_num_links: N300/T3K (1, 1), P150x4/P150x8/P300
    # (2, 2), TG/BHGLX (4, 3); (0, 0): no ethernet collectives)
    ccl_links: tuple[int, int] = (0, 0)
    # ``ttnn.cluster.get_cluster_type()``'s ClusterType member names this box reports, known
    # before any device opens (tt_metal/api/tt-metalium/cluster.hpp ClusterType)
    cluster_types: tuple[str, ...] = ()
    # the host's PCIe links to the box (None: no published figure for it)
    host_link: HostLink | None = None

    @property
    def num_chips(self) -> int:
        return self.mesh[0] * self.mesh[1]

    @property
    def meshes(self) -> tuple[tuple[int, int], ...]:
        """Every mesh shape tt-metal opens this device as, the default first."""
        return (self.mesh, *self.other_meshes)

    def links_on(self, mesh: tuple[int, int]) -> tuple[int, int]:
        """Links per axis of ``mesh`` opened on this device: ``ccl_links``, swapped when the
        mesh is the transposed shape (Galaxy 4x8 of its 8x4), at least 1 on a used axis."""
        links = self.ccl_links[::-1] if mesh == self.mesh[::-1] != self.mesh else self.ccl_links
        return (max(1, links[0]), max(1, links[1]))


# --------------------------------------------------------------------------------------------
# Per-architecture memory sizes
# --------------------------------------------------------------------------------------------

# Wormhole L1 per Tensix core: 1464 KiB.
#   tt_metal/hw/inc/internal/tt-1xx/wormhole/dev_mem_map.h: `#define MEM_L1_SIZE (1464 * 1024)`
#   tt_metal/soc_descriptors/wormhole_b0_80_arch.yaml: `worker_l1_size: 1499136`
WH_L1_BYTES = 1464 * 1024  # 1_499_136
# Firmware-reserved bottom of Wormhole L1: MEM_MAP_END = 35_168 B (34.3 KiB).
#   wormhole/dev_mem_map.h (0.81.1 wheel): `#define MEM_MAP_END (MEM_PACKET_HEADER_POOL_BASE +
#   MEM_PACKET_HEADER_POOL_SIZE)`, 35_168 when the header is evaluated. The header's own comment
#   "1432 KB = 1464 KB (L1 total) - 32 KB (MEM_MAP_END system reserved)" (the 32 KiB this table
#   used to hold) is stale: the fabric routing tables and packet-header pool grew the map. The
#   allocator's L1 base under mock is 105_824 = 35_168 + L1_KERNEL_CONFIG_BYTES.
WH_L1_FIRMWARE_RESERVED = 35_168
# Kernel-config buffer (runtime args, CB configs, kernel text) between MEM_MAP_END and the
# allocator's L1 base, both architectures: 69 KiB.
#   tt_metal/llrt/hal/tt-1xx/wormhole/wh_hal_tensix.cpp (and blackhole/bh_hal_tensix.cpp)
#   create_tensix_mem_map: `default_l1_kernel_config_size = 69 * 1024`, KERNEL_CONFIG base
#   MEM_MAP_END,
#   DEFAULT_UNRESERVED base = align_up(MEM_MAP_END + 69 KiB, max(DRAM_ALIGNMENT, L1_ALIGNMENT));
#   a device opened with worker_l1_size 0 (ttnn's DEFAULT_WORKER_L1_SIZE) gets DEFAULT_UNRESERVED.
L1_KERNEL_CONFIG_BYTES = 69 * 1024
# Wormhole DRAM bank (as ttnn interleaves over it): 1 GiB, 12 banks = 12 GiB per chip.
#   wormhole/dev_mem_map.h: `#define MEM_DRAM_SIZE (1048576 * 1024)`
#   wormhole_b0_80_arch.yaml: 6 `dram` channels, `dram_bank_size: 2147483648` per channel, split
#   into 12 `dram_views` (address_offset 0 / 1073741824) of `dram_view_size: 1073741824`.
WH_DRAM_BANK_BYTES = 1048576 * 1024  # 1_073_741_824
WH_DRAM_BANKS = 12
# Wormhole HAL DRAM reservation at the bottom of every bank: 1 MiB + 2 x DRAM_ALIGNMENT
# = 1_048_640 B (the allocator's DRAM base, ttnn.get_allocator_base_address(dev, DRAM), of
# 0.81.1 under mock; its DRAM bank is 1_073_741_824 - 1_048_640 = 1_072_693_184). Made of:
#   * DRAM_BARRIER_SIZE = one DRAM_ALIGNMENT (32 B) at address 0 (tt_metal/llrt/hal/tt-1xx/
#     wormhole/wh_hal.cpp: DRAM_BARRIER_BASE = 0, size rounded up to DRAM_ALIGNMENT;
#     DRAM_ALIGNMENT = max(NOC_DRAM_READ/WRITE_ALIGNMENT_BYTES) = 32 on Wormhole);
#   * the profiler region: 0 in the wheel (Tracy is off: TT_METAL_PROFILER_PROGRAM_SUPPORT_COUNT
#     does not move the base, and TT_METAL_NOC_DEBUG_DUMP=1 logs "requires a Tracy-enabled
#     build");
#   * HalDramMemAddrType::DEVICE_PRINT_DISPATCH, the DPRINT aggregation ring dispatch_s drains
#     core print buffers into: one DRAM_ALIGNMENT slot of read/write pointers, then the ring
#     (tt_metal/impl/debug/dprint_server.cpp attach_device: rw_pointers_address = region base,
#     buffer_address = base + DRAM_ALIGNMENT, buffer_size = region size - DRAM_ALIGNMENT;
#     tt_metal/impl/dispatch/kernel_config/dispatch_s.cpp the same for the kernel). The HAL
#     line sizing it was not in the sources read; 1 MiB + one DRAM_ALIGNMENT is what is left of
#     the measured base on both architectures (Blackhole: 1 MiB + 2 x 64).
WH_DRAM_ALIGNMENT = 32
DPRINT_DISPATCH_RING_BYTES = 1 << 20
WH_DRAM_RESERVED_PER_BANK = 2 * WH_DRAM_ALIGNMENT + DPRINT_DISPATCH_RING_BYTES  # 1_048_640

# Blackhole L1 per Tensix core: 1536 KiB (1.5 MiB).
#   tt_metal/hw/inc/internal/tt-1xx/blackhole/dev_mem_map.h: `#define MEM_L1_SIZE (1536 * 1024)`
#   tt_metal/soc_descriptors/blackhole_140_arch.yaml: `worker_l1_size: 1572864` (older snapshots
#   of this yaml said 1499136; dev_mem_map.h is what the firmware and allocator use).
BH_L1_BYTES = 1536 * 1024  # 1_572_864
# Firmware-reserved bottom of Blackhole L1: MEM_MAP_END = 41_088 B (40.1 KiB).
#   blackhole/dev_mem_map.h (0.81.1 wheel): MEM_MAP_END evaluates to 41_088 (the header now says
#   "Max kernel size = 1536 KB (L1 total) - MEM_MAP_END", MEM_MAX_KERNEL_SIZE 1497 KiB; older
#   snapshots said "1503 KB = 1536 KB - 33 KB", the 33 KiB this table used to hold). The
#   allocator's L1 base under mock is 111_744 = 41_088 + L1_KERNEL_CONFIG_BYTES.
BH_L1_FIRMWARE_RESERVED = 41_088
# Blackhole DRAM bank: 4 GiB - 16 MiB exposed per GDDR6 channel; 8 channels on P150/P300.
#   blackhole/dev_mem_map.h: `#define MEM_DRAM_SIZE (4177920 * 1024U)` = 4_278_190_080
#   blackhole_140_arch.yaml: 8 `dram` channels, `dram_bank_size: 4278190080`
#   (also `dram_view_size: 4278190080`, one view per channel).
# So a P150 chip exposes 8 x 4_278_190_080 = 34_225_520_640 B (31.875 GiB) of its 32 GiB GDDR6;
# the top 16 MiB of each channel is not in tt-metal's map.
BH_DRAM_BANK_BYTES = 4177920 * 1024  # 4_278_190_080
BH_DRAM_BANKS = 8
# P100 has one DRAM channel harvested: 7 banks.
#   tt-umd cluster_descriptor_types.hpp: expected_dram_harvested_units_map {P100, 1};
#   models/tt_transformers/tt/model_config.py determine_device_name(): "P100 DRAM grid is 7x1,
#   P150 is 8x1".
BH_P100_DRAM_BANKS = 7
# Blackhole HAL DRAM reservation per bank: 1 MiB + 2 x DRAM_ALIGNMENT = 1_048_704 B, the same
# regions as WH_DRAM_RESERVED_PER_BANK (tt_metal/llrt/hal/tt-1xx/blackhole/bh_hal.cpp;
# DRAM_ALIGNMENT is 64 on Blackhole). Measured: ttnn 0.81.1 under mock puts the allocator's DRAM
# base at 1_048_704 on P100/P150/P300/P150x4/P150x8, bank 4_278_190_080 - 1_048_704 =
# 4_277_141_376.
BH_DRAM_ALIGNMENT = 64
BH_DRAM_RESERVED_PER_BANK = 2 * BH_DRAM_ALIGNMENT + DPRINT_DISPATCH_RING_BYTES  # 1_048_704


# --------------------------------------------------------------------------------------------
# Chips
# --------------------------------------------------------------------------------------------

# Wormhole die: 8 columns x 10 rows = 80 Tensix
#   (tt_metal/soc_descriptors/wormhole_b0_80_arch.yaml `functional_workers`: 80 entries, x in
#   {1..4, 6..9}, y in {1..5, 7..11}).

# N150: 1 tensix row harvested (tt-umd expected_tensix_harvested_units_map {N150, 1}) -> 72 Tensix,
# product "nebula_x1". Default dispatch for an N150 cluster is WORKER on the ROW axis
# (ttnn/ttnn/device.py), which takes the last of the 9 rows: wormhole_b0_80_arch.yaml
# `nebula_x1` (row dispatch, 1 or 2 CQs) `compute_with_storage_grid_range: end: [7, 7]` -> 8x8 = 64.
WH_N150_CHIP = ChipSpec(
    arch="wormhole_b0",
    grid_x=8,
    grid_y=8,
    dram_bytes=WH_DRAM_BANKS * WH_DRAM_BANK_BYTES,  # 12 GiB
    l1_bytes=WH_L1_BYTES,
    dram_banks=WH_DRAM_BANKS,
    dram_reserved_bytes=WH_DRAM_BANKS * WH_DRAM_RESERVED_PER_BANK,
    l1_firmware_reserved_bytes=WH_L1_FIRMWARE_RESERVED,
    l1_kernel_config_bytes=L1_KERNEL_CONFIG_BYTES,
    enabled_tensix=72,
)

# N300 (both chips; also every chip of a T3K = 4 x N300): 2 tensix rows harvested
# (tt-umd {N300, 2}) -> 64 Tensix, product "nebula_x2". Default dispatch for cluster types
# N300 / T3K / N300_2x2 is ETH (ttnn/ttnn/device.py get_default_dispatch_core_type), so no
# Tensix row goes to dispatch: wormhole_b0_80_arch_eth_dispatch.yaml
# `nebula_x2: row: 1: compute_with_storage_grid_range: end: [7, 7]` -> 8x8 = 64 on the local
# and the remote chip alike. With tensix dispatch instead (DispatchCoreType.WORKER),
# wormhole_b0_80_arch.yaml `nebula_x2: ... end: [7, 6]` -> 8x7 = 56 on both chips.
WH_N300_CHIP = ChipSpec(
    arch="wormhole_b0",
    grid_x=8,
    grid_y=8,
    dram_bytes=WH_DRAM_BANKS * WH_DRAM_BANK_BYTES,
    l1_bytes=WH_L1_BYTES,
    dram_banks=WH_DRAM_BANKS,
    dram_reserved_bytes=WH_DRAM_BANKS * WH_DRAM_RESERVED_PER_BANK,
    l1_firmware_reserved_bytes=WH_L1_FIRMWARE_RESERVED,
    l1_kernel_config_bytes=L1_KERNEL_CONFIG_BYTES,
    enabled_tensix=64,
)

# Wormhole Galaxy chip (UBB, 32 per Galaxy): no tensix harvesting (tt-umd {UBB, 0}) -> 80 Tensix,
# product "galaxy". Default dispatch for a GALAXY cluster is WORKER on ROW (ttnn/ttnn/device.py),
# which takes one of the 10 rows -> 8x9 = 72. That is tt-metal PR #26373 (merged Aug 2025; issue
# #26632: "Galaxy with row dispatch compute grid was set to 8x8 when it should have been 8x9"),
# which changed wormhole_b0_80_arch.yaml `galaxy: row:` from `end: [7, 7]` (the text in the
# snapshots read here) to 9 rows; TT_METAL_CORE_GRID_OVERRIDE_TODEPRECATE="7,7" restores 8x8.
# Column dispatch (DispatchCoreAxis.COL, used by tt-metal's Galaxy Llama demos) gives
# `galaxy: col: ... end: [6, 9]` -> 7x10 = 70 (tt-metal issue #14569 / PR #15316).
WH_GALAXY_CHIP = ChipSpec(
    arch="wormhole_b0",
    grid_x=8,
    grid_y=9,
    dram_bytes=WH_DRAM_BANKS * WH_DRAM_BANK_BYTES,
    l1_bytes=WH_L1_BYTES,
    dram_banks=WH_DRAM_BANKS,
    dram_reserved_bytes=WH_DRAM_BANKS * WH_DRAM_RESERVED_PER_BANK,
    l1_firmware_reserved_bytes=WH_L1_FIRMWARE_RESERVED,
    l1_kernel_config_bytes=L1_KERNEL_CONFIG_BYTES,
    enabled_tensix=80,
)

# Blackhole die: 14 columns x 10 rows = 140 Tensix
#   (tt_metal/soc_descriptors/blackhole_140_arch.yaml `functional_workers`: x in {1..7, 10..16},
#   y in {2..11}). Blackhole harvests whole columns, and dispatch takes one more column
#   (default axis COL, ttnn/ttnn/device.py get_default_dispatch_core_axis).

# P150 (P150a/b/c; also each chip of a P300 and of a P150x4/P150x8 box): 2 tensix columns
# harvested (tt-umd {P150, 2}, {P300, 2}; tt-umd PR #1942 "Change p150 to expect 2 harvested
# columns" for firmware 19.5.0, Jan 2026, which unified all p150 cards, older ones included, to
# 120 Tensix; tt-metal issue #47014) -> 12x10 = 120 Tensix, product "2xharvested":
# blackhole_140_arch.yaml `2xharvested: col: 1: compute_with_storage_grid_range: end: [10, 9]`
# -> 11x10 = 110. (Cards on firmware older than 19.5.0 still show 140 Tensix, "unharvested",
# `end: [12, 9]` -> 13x10 = 130; tt-metal's own CI moved to 11x10 in PR #35056.)
BH_P150_CHIP = ChipSpec(
    arch="blackhole",
    grid_x=11,
    grid_y=10,
    dram_bytes=BH_DRAM_BANKS * BH_DRAM_BANK_BYTES,  # 34_225_520_640
    l1_bytes=BH_L1_BYTES,
    dram_banks=BH_DRAM_BANKS,
    dram_reserved_bytes=BH_DRAM_BANKS * BH_DRAM_RESERVED_PER_BANK,
    l1_firmware_reserved_bytes=BH_L1_FIRMWARE_RESERVED,
    l1_kernel_config_bytes=L1_KERNEL_CONFIG_BYTES,
    enabled_tensix=120,
)

# P100: same 2 harvested tensix columns (tt-umd {P100, 2}) -> 11x10 = 110 like P150, but one DRAM
# channel harvested -> 7 banks (see BH_P100_DRAM_BANKS); no ethernet (tt-umd
# expected_eth_harvested_units_map {P100, 14}), so single chip only.
BH_P100_CHIP = ChipSpec(
    arch="blackhole",
    grid_x=11,
    grid_y=10,
    dram_bytes=BH_P100_DRAM_BANKS * BH_DRAM_BANK_BYTES,  # 29_947_330_560
    l1_bytes=BH_L1_BYTES,
    dram_banks=BH_P100_DRAM_BANKS,
    dram_reserved_bytes=BH_P100_DRAM_BANKS * BH_DRAM_RESERVED_PER_BANK,
    l1_firmware_reserved_bytes=BH_L1_FIRMWARE_RESERVED,
    l1_kernel_config_bytes=L1_KERNEL_CONFIG_BYTES,
    enabled_tensix=120,
)

# Blackhole Galaxy chip (UBB_BLACKHOLE, 32 per box): 1 tensix column harvested
# (tt-umd {UBB_BLACKHOLE, 1}) -> 13x10 = 130 Tensix, product "1xharvested":
# blackhole_140_arch.yaml `1xharvested: col: 1: ... end: [11, 9]` -> 12x10 = 120.
BH_GALAXY_CHIP = ChipSpec(
    arch="blackhole",
    grid_x=12,
    grid_y=10,
    dram_bytes=BH_DRAM_BANKS * BH_DRAM_BANK_BYTES,  # tt-umd {UBB_BLACKHOLE, 0} DRAM harvested
    l1_bytes=BH_L1_BYTES,
    dram_banks=BH_DRAM_BANKS,
    dram_reserved_bytes=BH_DRAM_BANKS * BH_DRAM_RESERVED_PER_BANK,
    l1_firmware_reserved_bytes=BH_L1_FIRMWARE_RESERVED,
    l1_kernel_config_bytes=L1_KERNEL_CONFIG_BYTES,
    enabled_tensix=130,
)


# --------------------------------------------------------------------------------------------
# Boards and boxes (mesh shapes from tt-metal's MESH_DEVICE -> MeshShape tables and
# models/tt_transformers/tt/model_config.py determine_device_name(); chips per board from tt-umd
# cluster_descriptor_types.hpp get_number_of_chips_from_board_type: N150 1, N300 2, P100 1,
# P150 1, P300 2, UBB / UBB_BLACKHOLE 32)
# --------------------------------------------------------------------------------------------

N150 = DeviceSpec(
    name="n150",
    chip=WH_N150_CHIP,
    mesh=(1, 1),  # MESH_DEVICE "N150": (1, 1)
    dispatch="worker-row",
    description="Wormhole n150: one chip",
    cluster_types=("N150",),
    host_link=WORMHOLE_LINK,
)
N300 = DeviceSpec(
    name="n300",
    chip=WH_N300_CHIP,
    mesh=(1, 2),  # MESH_DEVICE "N300": (1, 2)
    dispatch="eth",
    description="Wormhole n300: two chips on one card (one PCIe-attached, one over ethernet)",
    ccl_links=(1, 1),
    cluster_types=("N300",),
    host_link=WORMHOLE_LINK,  # one link per card
)
T3K = DeviceSpec(
    name="t3k",
    chip=WH_N300_CHIP,
    mesh=(1, 8),  # MESH_DEVICE "T3K": (1, 8); tt-metal models also open it as (2, 4)
    dispatch="eth",
    other_meshes=((2, 4),),
    description="Wormhole T3000 (LoudBox/QuietBox): 4 x n300 = 8 chips",
    ccl_links=(1, 1),
    cluster_types=("T3K",),
    host_link=replace(WORMHOLE_LINK, links=4),  # one per n300 card
)
GALAXY = DeviceSpec(
    name="galaxy",
    chip=WH_GALAXY_CHIP,
    mesh=(8, 4),  # MESH_DEVICE "TG": (8, 4); also opened as (4, 8)
    dispatch="worker-row",
    other_meshes=((4, 8),),
    description="Wormhole Galaxy: 32 chips",
    ccl_links=(4, 3),
    cluster_types=("GALAXY", "TG"),
)
P100 = DeviceSpec(
    name="p100",
    chip=BH_P100_CHIP,
    mesh=(1, 1),  # determine_device_name: 1 Blackhole device with a 7x1 DRAM grid -> "P100"
    dispatch="worker-col",
    description="Blackhole p100a: one chip, 7 DRAM channels, no ethernet",
    cluster_types=("P100",),
    host_link=BLACKHOLE_LINK,
)
P150 = DeviceSpec(
    name="p150",
    chip=BH_P150_CHIP,
    mesh=(1, 1),  # MESH_DEVICE "P150": (1, 1)
    dispatch="worker-col",
    description="Blackhole p150a/p150b: one chip",
    cluster_types=("P150",),
    host_link=BLACKHOLE_LINK,
)
P300 = DeviceSpec(
    name="p300",
    chip=BH_P150_CHIP,
    mesh=(1, 2),  # MESH_DEVICE "P300": (1, 2)
    dispatch="worker-col",
    description="Blackhole p300: two chips on one card",
    ccl_links=(2, 2),
    cluster_types=("P300",),
    host_link=BLACKHOLE_LINK,  # one x16 slot per card
)
P150X4 = DeviceSpec(
    name="p150x4",
    chip=BH_P150_CHIP,
    mesh=(1, 4),  # MESH_DEVICE "P150x4": (1, 4)
    dispatch="worker-col",
    description="Blackhole QuietBox: 4 x p150",
    ccl_links=(2, 2),
    cluster_types=("P150_X4",),
    host_link=replace(BLACKHOLE_LINK, links=4),
)
P150X8 = DeviceSpec(
    name="p150x8",
    chip=BH_P150_CHIP,
    mesh=(1, 8),  # MESH_DEVICE "P150x8": (1, 8)
    dispatch="worker-col",
    description="Blackhole LoudBox: 8 x p150",
    ccl_links=(2, 2),
    cluster_types=("P150_X8",),
    host_link=replace(BLACKHOLE_LINK, links=8),
)
BH_GALAXY = DeviceSpec(
    name="bh_galaxy",
    chip=BH_GALAXY_CHIP,
    mesh=(8, 4),  # MESH_DEVICE "BHGLX": (8, 4); qwen36 opens the full (4, 8)
    dispatch="worker-col",
    other_meshes=((4, 8),),
    description="Blackhole Galaxy: 32 chips",
    ccl_links=(4, 3),
    cluster_types=("BLACKHOLE_GALAXY",),
)

DEVICES: dict[str, DeviceSpec] = {
    d.name: d for d in (N150, N300, T3K, GALAXY, P100, P150, P300, P150X4, P150X8, BH_GALAXY)
}


def device_spec(name: str) -> DeviceSpec:
    """The spec for a name users pass on the command line (case-insensitive)."""
    spec = DEVICES.get(name.strip().lower())
    if spec is None:
        known = ", ".join(sorted(DEVICES))
        raise ValueError(f"unknown device {name!r}; known devices: {known}")
    return spec


def board_for_cluster(cluster_type: str) -> DeviceSpec:
    """The box a ``ttnn.cluster.get_cluster_type()`` name (``"P150"``, ``"T3K"``, ...)
    describes: the one way the server identifies its hardware, before the device opens (the
    trace region and every pool are planned on this box's chip). Raises ValueError for a cluster
    type no description has, naming the known ones."""
    for d in DEVICES.values():
        if cluster_type in d.cluster_types:
            return d
    known = ", ".join(sorted(t for d in DEVICES.values() for t in d.cluster_types))
    raise ValueError(
        f"no device description for cluster type {cluster_type!r} (known: {known}); pass "
        "--trace-region-size and --kv-blocks to start without a plan"
    )
