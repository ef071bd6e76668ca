"""The device rules tt-metal enforces on the ops the backend calls: what every rule module
shares (pure Python: no ttnn, no numpy).

Each rule function mirrors the host-side validation of one device operation (``TT_FATAL`` in its
``validate_on_program_cache_miss`` or program factory) and raises :class:`DeviceLimitError`
with a dotted rule name (``<op>.<check>``) and a message that names the limit, the numbers and
what to change. The source is cited next to each check: paths are in ``tenstorrent/tt-metal``
(a bare file name is a file under the op's folder), read at recent commits. For ttnn 0.81.1
(the pinned wheel) a check was confirmed when its message string is present in the wheel's
``_ttnncpp.so`` / ``libtt_metal.so`` (noted "0.81.1: present"); where the wheel differs from
the sources, it says so. Limits that are modelled rather than read (DRAM banks, the size of a
captured trace) say how.

The rules sit one op family a module, beside the virtual device's module for that family
(``rules_<family>.py`` for ``<family>.py``: matmul, moe, movement, eltwise, attention, gdn,
ccl); this module holds what they share: the tile sizes, :class:`DeviceLimitError`, the operand
description and the core grid's rules.

Tensors are described by :class:`TensorInfo` (logical shape, dtype, layout, placement); the
virtual device (``tt_serve/model/tt/virtual/``) builds one per operand and calls these rules on
every op, allocation and trace capture.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tt_serve.model.tt.boards import ChipSpec

TILE = 32
# bytes of one 32x32 tile (tt::tile_size): block floats share one exponent per 16 values.
TILE_BYTES = {
    "float32": 4096,
    "bfloat16": 2048,
    "bfloat8_b": 1088,  # 1024 mantissa bytes + 64 shared exponents
    "bfloat4_b": 576,  # 512 + 64
    "uint32": 4096,
    "int32": 4096,
    "uint16": 2048,
}
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "uint32": 4, "int32": 4, "uint16": 2}


class DeviceLimitError(ValueError):
    """A call tt-metal would reject (TT_FATAL) on the modelled chip."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


@dataclass(frozen=True)
class Shard:
    """A sharded memory config: ``num_cores`` shards of ``shape`` (height, width) elements."""

    num_cores: int
    shape: tuple[int, int]
    strategy: str = "height"  # "height" | "width" | "block"
    orientation: str = "row_major"


@dataclass(frozen=True)
class TensorInfo:
    """What a rule needs of an operand: logical shape, dtype name, layout ("tile" or
    "row_major"), buffer ("dram" or "l1") and the shard spec when sharded."""

    shape: tuple[int, ...]
    dtype: str
    layout: str
    buffer: str = "dram"
    shard: Shard | None = None

    @property
    def tile(self) -> bool:
        return self.layout == "tile"

    @property
    def padded_shape(self) -> tuple[int, ...]:
        """TILE pads the last two dims to 32 (ttnn padded_shape); ROW_MAJOR is unpadded."""
        s = list(self.shape)
        if self.tile:
            for i in (-1, -2):
                if len(s) >= -i:
                    s[i] = round_up(s[i], TILE)
        return tuple(s)

    @property
    def pages(self) -> int:
        """Interleaved pages: one tile each (TILE; rank < 2 pads to one tile row) or one row
        each (ROW_MAJOR)."""
        p = self.padded_shape
        if self.tile:
            width = p[-1] if p else TILE
            height = p[-2] if len(p) >= 2 else TILE
            return math.prod(p[:-2]) * (height // TILE) * (width // TILE)
        return math.prod(p[:-1]) if len(p) > 1 else 1

    @property
    def page_bytes(self) -> int:
        if self.tile:
            return TILE_BYTES[self.dtype]
        if self.dtype not in ELEMENT_BYTES:
            raise DeviceLimitError("layout.block_float", f"{self.dtype} exists only in TILE layout")
        return (self.shape[-1] if self.shape else 1) * ELEMENT_BYTES[self.dtype]


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _fail(rule: str, ok: bool, message: str) -> None:
    if not ok:
        raise DeviceLimitError(rule, message)


def _is(t: TensorInfo, dtypes: Sequence[str]) -> bool:
    return t.dtype in dtypes


# ---- core grid -------------------------------------------------------------------------------
def num_cores_to_corerangeset(chip: ChipSpec, n: int) -> None:
    """tt_metal work_split (num_cores_to_corerangeset): "Target number of cores {} is greater than
    total number of available cores {}" (0.81.1: present)."""
    _fail(
        "cores.corerangeset",
        0 < n <= chip.num_cores,
        f"{n} cores requested from a {chip.grid_x}x{chip.grid_y} = {chip.num_cores}-core grid "
        "(one decode user per core for the height-sharded KV update): lower max_batch to "
        f"<= {chip.num_cores} or split the batch",
    )


def op_cores(chip: ChipSpec, output_tiles: int) -> int:
    """Cores a generic op runs on: split_work_to_cores over its output tiles, capped by the grid
    (the trace-size estimate's per-core term)."""
    return max(1, min(chip.num_cores, output_tiles))
