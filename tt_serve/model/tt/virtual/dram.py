"""DRAM and trace-region accounting of one chip (pure Python), as tt-metal's allocator does it.

The op rules live in ``virtual/rules_*.py``; this module keeps the books: every device buffer
charged per DRAM bank (an allocation past the chip fails), and every captured trace charged against the
trace region (a capture past ``trace_region_size`` fails at ``end_trace_capture``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tt_serve.model.tt.boards import ChipSpec
from tt_serve.model.tt.virtual.rules_base import DeviceLimitError, TensorInfo, round_up

# DRAM geometry per arch (banks, bytes per bank, alignment) when the ChipSpec does not give it,
# from the 0.81.1 wheel: soc_descriptors/wormhole_b0_80_arch.yaml has 12 dram_views of
# dram_view_size 1073741824, blackhole_140_arch.yaml 8 of 4278190080 (4 GiB - 16 MiB);
# LOG_BASE_2_OF_DRAM_ALIGNMENT 5 / 6 in hw/inc/internal/tt-1xx/{wormhole,blackhole}/core_config.h.
DRAM_BANKS = {"wormhole_b0": (12, 1 << 30, 32), "blackhole": (8, 4278190080, 64)}
# Size of a captured trace: an ESTIMATE. tt-metal sizes the trace buffer from the recorded
# dispatch command stream (tt_metal/distributed/mesh_trace.cpp populate_mesh_buffer: the recorded
# size rounded up to the trace page size, summed over live traces, compared with
# trace_region_size). The stream holds, per program, fixed commands (launch message, go signal,
# CB and semaphore config, binary relay) plus runtime-argument writes for each core it runs on;
# no exact formula is derivable without a device, so a program costs FIXED + PER_CORE x cores (~64 MB for 2000 full-grid programs, the
# order of a 9B decode step; consistent in magnitude with qwen36's "~300MB for the default
# buckets at max_seq=512" and 200 MB decode-only serving profiles). Measure with
# TT_METAL_TRACE_ALLOC_TRACKING=1 on hardware and recalibrate.
TRACE_PROGRAM_BYTES = 4096
TRACE_CORE_BYTES = 256
# trace_dispatch::compute_interleaved_trace_buf_page_size picks pages of at most 4 KiB
TRACE_PAGE_BYTES = 4096


TRACE_BANK_ROUND = 8192  # a bank's share of the trace region is a whole number of 8 KiB


@dataclass
class DramBudget:
    """Interleaved DRAM of one chip. tt-metal allocates lock-step across banks (tech_reports/
    memory/allocator.md): a buffer takes ceil(pages / banks) aligned pages in EVERY bank. Each
    bank holds dram_view_size minus its share of the trace region: ``trace_region_size`` is split
    over the banks, each giving up ``trace_region_size / banks`` (measured on tt-metal 0.81.1's
    own allocator on mock boxes: 64, 100 and 112 MiB regions took 8, 12.5 and 14 MiB from each
    of a P150's 8 banks; tests/tt/mock/test_boards.py). Allocation past a bank fails like "Out of Memory: Not enough
    space to allocate {} B {} buffer across {} banks" (bank_manager.cpp, 0.81.1)."""

    chip: ChipSpec
    trace_region_size: int = 0
    reserve_per_bank: int = 0
    held: dict[int, tuple[str, int]] = field(default_factory=dict)  # key -> (label, per bank)
    _used: int = field(default=0, init=False, repr=False)  # the sum of held, kept as it changes
    _traces: int = field(default=0, init=False, repr=False)  # of it, trace buffers (region 0)
    _trace_keys: set[int] = field(default_factory=set, init=False, repr=False)
    # The high-water mark of ``used_per_bank`` less the trace buffers, at every allocation of a
    # tensor: with ``trace_region_size`` 0 the traces live in ordinary DRAM, and this is the
    # peak the same run has when a region holds them (the planner sizes both from one run).
    peak_less_traces: int = field(default=0, init=False, repr=False)

    @property
    def banks(self) -> int:
        return _banks(self.chip)

    @property
    def bank_bytes(self) -> int:
        """Allocatable bytes per bank: the bank (at most the soc descriptor's view) less the HAL
        reservation, the trace region and ``reserve_per_bank``."""
        view = DRAM_BANKS.get(self.chip.arch, (0, self.chip.dram_bytes, 0))[1]
        bank = min(self.chip.dram_bytes // self.banks, view)
        hal = self.chip.dram_reserved_bytes // self.banks
        return bank - hal - self.trace_per_bank - self.reserve_per_bank

    @property
    def trace_per_bank(self) -> int:
        """Each bank's share of the trace region: ceil(size / banks) rounded up to 8 KiB (what
        0.81.1's allocator takes on every mock board, tests/tt/mock/test_boards.py)."""
        return round_up(-(-self.trace_region_size // self.banks), TRACE_BANK_ROUND)

    @property
    def used_per_bank(self) -> int:
        return self._used

    def per_bank(self, t: TensorInfo) -> int:
        align = DRAM_BANKS.get(self.chip.arch, (1, 0, 32))[2]
        return -(-t.pages // self.banks) * round_up(t.page_bytes, align)

    def allocate(self, key: int, t: TensorInfo, label: str = "") -> None:
        what = f"{list(t.shape)} {t.dtype} {t.layout}"
        self._charge(key, self.per_bank(t), label or what, what)
        self.peak_less_traces = max(self.peak_less_traces, self._used - self._traces)

    def allocate_pages(self, key: int, pages: int, page_bytes: int, label: str) -> None:
        """A raw interleaved buffer (a trace buffer when trace_region_size is 0)."""
        self._charge(key, -(-pages // self.banks) * page_bytes, label, label)
        self._traces += self.held[key][1]
        self._trace_keys.add(key)

    def _charge(self, key: int, need: int, label: str, what: str) -> None:
        cap = self.bank_bytes
        if self.used_per_bank + need > cap:
            raise DeviceLimitError("dram.capacity", self._oom(what, need, cap))
        self.free(key)
        self.held[key] = (label, need)
        self._used += need

    def free(self, key: int) -> None:
        _, was = self.held.pop(key, ("", 0))
        self._used -= was
        if key in self._trace_keys:
            self._trace_keys.discard(key)
            self._traces -= was

    def _oom(self, what: str, need: int, cap: int) -> str:
        groups: dict[str, tuple[int, int]] = {}
        for label, b in self.held.values():
            n, total = groups.get(label, (0, 0))
            groups[label] = (n + 1, total + b * self.banks)
        top = sorted(groups.items(), key=lambda kv: -kv[1][1])[:4]
        holders = "; ".join(f"{n} x {lab} = {_gb(total)}" for lab, (n, total) in top)
        return (
            f"{what} needs {need} B in each of {self.banks} banks; "
            f"{self.used_per_bank} of {cap} B per bank are taken ({_gb(self.used_per_bank * self.banks)} "
            f"of {_gb(cap * self.banks)} on the {self.chip.arch} chip after a "
            f"{_gb(self.trace_region_size)} trace region). Largest holders: {holders}. "
            "Use bfloat8_b/bfloat4_b weights, fewer KV blocks or snapshots, a smaller trace region, "
            "or a chip with more DRAM"
        )


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _banks(chip: ChipSpec) -> int:
    return chip.dram_banks or DRAM_BANKS.get(chip.arch, (1, 0, 0))[0]


def trace_bytes(chip: ChipSpec, program_cores: Sequence[int]) -> int:
    """Estimated trace buffer for programs on ``program_cores`` cores each (see TRACE_* above),
    rounded up to whole pages in every DRAM bank."""
    raw = sum(TRACE_PROGRAM_BYTES + TRACE_CORE_BYTES * c for c in program_cores)
    return round_up(max(raw, 1), TRACE_PAGE_BYTES * _banks(chip))


@dataclass
class TraceRegion:
    """Live traces in the trace region: tt_metal/distributed/mesh_trace.cpp populate_mesh_buffer,
    ``TT_FATAL(get_trace_buffers_size() <= trace_region_size, "Creating trace buffers of size {}B
    on MeshDevice {}, but only {}B is allocated for trace region.")`` at end_trace_capture (0.81.1:
    present); release_trace gives the bytes back (tt-metal PR #27966). With trace_region_size 0
    the trace buffer is an ordinary DRAM buffer instead (the caller charges DRAM)."""

    chip: ChipSpec
    size: int
    live: dict[int, int] = field(default_factory=dict)

    def end_capture(self, trace_id: int, program_cores: Sequence[int]) -> int:
        need = trace_bytes(self.chip, program_cores)
        total = sum(self.live.values()) + need
        if self.size and total > self.size:
            raise DeviceLimitError(
                "trace.region",
                f"Creating trace buffers of size {total}B, but only {self.size}B is allocated "
                f"for trace region: trace {trace_id} ({len(program_cores)} programs, ~{need} B "
                f"estimated) on top of {len(self.live)} live trace(s) of {total - need} B. Open "
                f"the device with trace_region_size >= {total} or capture fewer traces",
            )
        self.live[trace_id] = need
        return need

    def release(self, trace_id: int) -> None:
        self.live.pop(trace_id, None)
