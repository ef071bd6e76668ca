"""Device rules of the collectives (CCL) on a 1 x N mesh, which the mesh (``mesh.py``,
``ccl.py``) applies on every chip: ``all_gather_async`` and ``reduce_scatter_minimal_async``
(conventions: ``rules_base.py``)."""

from __future__ import annotations

from tt_serve.model.tt.boards import ChipSpec
from tt_serve.model.tt.virtual.rules_base import TILE, TensorInfo, _fail, _is

# Buffer alignment of a DRAM page per arch (LOG_BASE_2_OF_DRAM_ALIGNMENT, memory.DRAM_BANKS).
CCL_DRAM_ALIGNMENT = {"wormhole_b0": 32, "blackhole": 64}
# Semaphores each experimental CCL program takes (besides the barrier semaphore).
ALL_GATHER_SEMAPHORES = 2
REDUCE_SCATTER_SEMAPHORES = 3


def _ccl_common(
    rule: str, chip: ChipSpec, x: TensorInfo, ring: int, num_links: int, max_links: int
) -> None:
    """What every experimental CCL checks before its program is built (the device-operation
    files cited by the callers): more than one device on the line, 0 < num_links (and the links
    a program uses are parallelised over worker rows: ``num_links <= grid.y``), aligned pages.
    ``max_links``: the Ethernet links the system has between neighbours
    (models/tt_transformers/tt/ccl.py get_num_links: N300/T3K 1, P150x4 2, Galaxy 4/3)."""
    _fail(rule + ".devices", ring > 1, f"needs more than one device on the line, got {ring}")
    _fail(rule + ".num_links", num_links > 0, f"num_links should be more than 0, got {num_links}")
    _fail(
        rule + ".num_links",
        num_links <= chip.grid_y and (max_links == 0 or num_links <= max_links),
        f"num_links {num_links} exceeds the {max_links} link(s) between neighbours or the "
        f"{chip.grid_y} worker rows",
    )
    align = CCL_DRAM_ALIGNMENT.get(chip.arch, 32)
    _fail(
        rule + ".page_alignment",
        x.tile or x.page_bytes % align == 0,
        f"a {x.page_bytes} B row-major page is not {align}-B aligned ('currently requires aligned "
        "pages')",
    )


def all_gather_async(
    chip: ChipSpec,
    x: TensorInfo,
    dim: int,
    ring: int,
    num_semaphores: int,
    num_links: int,
    max_links: int,
    *,
    capturing: bool,
) -> tuple[int, ...]:
    """ttnn/cpp/ttnn/operations/experimental/ccl/all_gather_async/device/all_gather_async_device_operation.cpp:
    "Default
    implementation requires 2 semaphores", "AllGatherAsync requires tensor of rank 2 or
    greater", "all_gather_async op will only work for num_devices > 1", "All Gather currently
    requires aligned pages", num_links > 0 and <= grid.y. Under trace capture the gather dim
    must not be a tile-padded one (or the input ROW_MAJOR): those take the composite path
    through all_broadcast, whose internal semaphores a replay can overwrite (tt-metal #40382 /
    PR #40276; notes/ttnn-mesh.md 3.8). Returns the output shape (``dim`` times ``ring``)."""
    rule = "all_gather_async"
    _fail(
        rule + ".semaphores",
        num_semaphores == ALL_GATHER_SEMAPHORES,
        f"Default implementation requires {ALL_GATHER_SEMAPHORES} semaphores, got {num_semaphores}",
    )
    rank = len(x.shape)
    _fail(rule + ".rank", rank >= 2, f"requires tensor of rank 2 or greater, got {x.shape}")
    _fail(rule + ".dim", -rank <= dim < rank, f"dim {dim} for rank {rank}")
    _ccl_common(rule, chip, x, ring, num_links, max_links)
    d = dim % rank
    padded = x.tile and d >= rank - 2 and x.shape[d] % TILE != 0
    _fail(
        rule + ".composite",
        not capturing or (x.tile and not padded),
        f"gathering {x.shape} {x.layout} on dim {dim} takes the composite (all_broadcast) path, "
        "unsafe under trace (tt-metal #40382): gather a tile-aligned dim of a TILE tensor",
    )
    out = list(x.shape)
    out[d] *= ring
    return tuple(out)


def reduce_scatter_minimal_async(
    chip: ChipSpec,
    x: TensorInfo,
    dim: int,
    ring: int,
    num_semaphores: int,
    num_links: int,
    max_links: int,
    topology: str,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ttnn/cpp/ttnn/operations/experimental/ccl/reduce_scatter_minimal_async/device/reduce_scatter_minimal_async_op_device_operation.cpp:
    "reduce_scatter currently supports rank 2 tensors at minimum", the scatter dim (normalised to 4-D) divisible by
    ring_size, in tiles when it is one of the last two ("Number of tiles at dimension {} must
    be divisible by ring_size"), "Expected 3 semaphores"; dtypes BF16/BFP8/F32 (the 0.81.1
    ``ttnn.reduce_scatter`` docstring). Returns (intermediate, output) shapes: the intermediate
    buffer is the padded input with dim 0 doubled on Linear (compute_output_specs), the output
    has ``dim`` divided by ``ring``. Its "Topology must be either Ring or Linear" is not
    modelled: the virtual mesh's ``Topology`` has only those two ("ring", "linear")."""
    rule = "reduce_scatter_minimal_async"
    _fail(
        rule + ".semaphores",
        num_semaphores == REDUCE_SCATTER_SEMAPHORES,
        f"Expected {REDUCE_SCATTER_SEMAPHORES} semaphores but got {num_semaphores}",
    )
    rank = len(x.shape)
    _fail(rule + ".rank", rank > 1, f"supports rank 2 tensors at minimum, got {x.shape}")
    _fail(rule + ".dim", -rank <= dim < rank, f"Invalid scatter dim {dim} for rank {rank}")
    _fail(
        rule + ".dtype",
        _is(x, ("bfloat16", "bfloat8_b", "float32")),
        f"{x.dtype} (BF16, BFP8, F32 only)",
    )
    _ccl_common(rule, chip, x, ring, num_links, max_links)
    d = dim % rank
    padded = x.padded_shape
    if x.tile and d >= rank - 2:
        ok = (padded[d] // TILE) % ring == 0
        msg = (
            f"Number of tiles at dimension {dim} ({padded[d] // TILE}) must be divisible by {ring}"
        )
    else:
        ok = padded[d] % ring == 0
        msg = f"Dimension {dim} ({padded[d]}) must be divisible by ring_size {ring}"
    _fail(rule + ".divisible", ok, msg)
    inter = list(padded)
    if topology == "linear":
        inter[0] *= 2
    out = list(x.shape)
    out[d] //= ring
    return tuple(inter), tuple(out)
