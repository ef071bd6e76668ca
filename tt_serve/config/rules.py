"""The invariant rule set of a serve configuration: :func:`validate`.

The rules in :func:`validate` are the same rules, with the same messages, as the NixOS
assertions in ``modules/lib/invariants.nix``; ``tests/nix`` evaluates both over one truth table
and requires identical verdicts. Messages name options by their NixOS names
(``services.tenstorrent-serving.<option>``) so that a deployment error and a CLI error read the
same.
"""

from __future__ import annotations

import re

from tt_serve.config.serve_config import (
    BACKENDS,
    DISK_WRITEBACKS,
    DTYPES,
    GDN_CHUNK,
    LOG_LEVELS,
    NIX_PREFIX,
    PRECISIONS,
    RESUME_POINTS,
    ROUTER_POLICIES,
    ServeConfig,
    parse_mesh,
)

# Mesh sides tensor parallel opens (tt-metal's MESH_DEVICE shapes: (1, 2), (1, 4), (1, 8), (2, 4)
# on T3K, (8, 4) / (4, 8) on Galaxy); the model's own splits are checked at startup
# (model/tt/layout/parallel.py).
MESH_SIDES = (1, 2, 4, 8)
TTNN_MAX_BATCH = 32
TTNN_BLOCK_ALIGN = 32
"""ttnn stores paged KV in TILE layout (32 x 32), so a KV block holds whole tile rows."""

_CUDA_DEVICE = re.compile(r"cuda(:[0-9]+)?")


def validate(cfg: ServeConfig) -> list[str]:
    """Every violated invariant, in rule order; empty means the configuration can work.

    Keep this in the same order and wording as ``modules/lib/invariants.nix``.
    """
    p = NIX_PREFIX
    ttnn = cfg.backend == "ttnn"
    accelerated = ttnn or (
        cfg.backend == "torch" and _CUDA_DEVICE.fullmatch(cfg.device) is not None
    )
    where = f"got backend {cfg.backend}, device {cfg.device}"
    ids = ",".join(str(i) for i in cfg.device_ids)
    mesh = parse_mesh(cfg.mesh) if cfg.mesh else None
    chips = mesh[0] * mesh[1] if mesh is not None else 0
    rules: list[tuple[bool, str]] = [
        (1 <= cfg.port <= 65535, f"{p}.port must be in 1..65535 (got {cfg.port})."),
        (cfg.backend in BACKENDS, f"{p}.backend must be one of torch, ttnn (got {cfg.backend})."),
        (
            cfg.device == "cpu" or _CUDA_DEVICE.fullmatch(cfg.device) is not None,
            f"{p}.device must be cpu, cuda or cuda:N (got {cfg.device}).",
        ),
        (
            not ttnn or (len(cfg.device_ids) > 0 and min(cfg.device_ids) >= 0 and _distinct(cfg)),
            f"{p}.deviceIds must be a non-empty list of distinct non-negative integers "
            f'on backend ttnn (got "{ids}").',
        ),
        (
            not cfg.mesh or mesh is not None,
            f'{p}.mesh must be "ROWSxCOLS" with positive integers, e.g. "1x4" (got "{cfg.mesh}").',
        ),
        (
            not cfg.mesh or ttnn,
            f'{p}.mesh shapes a Tenstorrent mesh; it needs {p}.backend = "ttnn" '
            f"(got backend {cfg.backend}).",
        ),
        (
            not ttnn or mesh is None or mesh[0] * mesh[1] == len(cfg.device_ids),
            f'{p}.mesh = "{cfg.mesh}" has {chips} chips but {p}.deviceIds names '
            f'{len(cfg.device_ids)} ("{ids}"): give one device id per chip.',
        ),
        (
            not ttnn or mesh is None or (mesh[0] in MESH_SIDES and mesh[1] in MESH_SIDES),
            f'{p}.mesh = "{cfg.mesh}": each side must be 1, 2, 4 or 8 (the shapes tt-metal '
            "opens: 1x2, 1x4, 1x8, 2x4, 8x4, 4x8; heads and tile widths split by powers of two).",
        ),
        (
            not ttnn or mesh is None or mesh[0] == 1 or mesh[1] > 1,
            f'{p}.mesh = "{cfg.mesh}" puts the chips in one column; tensor parallel splits the '
            f'heads over the columns: use "1x{chips}".',
        ),
        (
            cfg.dtype in DTYPES,
            f"{p}.dtype must be one of auto, float32, bfloat16 (got {cfg.dtype}).",
        ),
        (
            not ttnn or cfg.dtype != "float32",
            f"{p}.dtype = float32 is not available on backend ttnn (it computes in bfloat16 "
            f"and block floats): use auto or bfloat16, and {p}.precision for the weights.",
        ),
        (
            cfg.precision in PRECISIONS,
            f"{p}.precision must be one of {', '.join(PRECISIONS)} (got {cfg.precision}).",
        ),
        (
            ttnn
            or cfg.precision == "auto"
            or (not _CUDA_DEVICE.fullmatch(cfg.device) and cfg.dtype != "bfloat16"),
            f"{p}.precision = {cfg.precision} on backend torch holds the card's weight formats "
            f"for the CPU's float32 kernels: it needs a CPU {p}.device and {p}.dtype auto or "
            f"float32 (got device {cfg.device}, dtype {cfg.dtype}).",
        ),
        (
            cfg.device_resident is not True or cfg.device_argmax,
            f"{p}.deviceResident = true requires {p}.deviceArgmax = true "
            "(the decode loop feeds sampled ids back on the device; logits never leave it).",
        ),
        (
            cfg.device_resident is not True or accelerated,
            f'{p}.deviceResident = true needs {p}.backend = "ttnn" or a CUDA {p}.device ({where}).',
        ),
        (
            cfg.traced_prefill is not True or accelerated,
            f'{p}.tracedPrefill = true needs {p}.backend = "ttnn" or a CUDA {p}.device ({where}).',
        ),
        (
            0 < cfg.gpu_memory_utilization <= 1,
            f"{p}.gpuMemoryUtilization must be more than 0 and at most 1 (a fraction of the "
            "GPU's memory).",
        ),
        (cfg.block_size > 0, f"{p}.blockSize must be positive (got {cfg.block_size})."),
        (
            not ttnn or cfg.block_size % TTNN_BLOCK_ALIGN == 0,
            f"{p}.blockSize must be a multiple of {TTNN_BLOCK_ALIGN} on backend ttnn "
            f"(TILE rows; got {cfg.block_size}).",
        ),
        (cfg.prefill_chunk > 0, f"{p}.prefillChunk must be positive (got {cfg.prefill_chunk})."),
        (
            not cfg.prefix_caching
            or (
                _multiple(cfg.prefill_chunk, cfg.block_size) and cfg.prefill_chunk % GDN_CHUNK == 0
            ),
            f"{p}.prefixCaching.enable = true requires {p}.prefillChunk ({cfg.prefill_chunk}) "
            f"to be a multiple of {p}.blockSize ({cfg.block_size}) and of the GDN chunk "
            f"({GDN_CHUNK}): snapshots are taken only at chunk boundaries.",
        ),
        (
            not cfg.prefix_caching or cfg.snapshot_slots >= 1,
            f"{p}.prefixCaching.enable = true requires {p}.prefixCaching.snapshotSlots >= 1 "
            f"(got {cfg.snapshot_slots}).",
        ),
        (
            cfg.resume_points in RESUME_POINTS,
            f"{p}.resumePoints must be one of {', '.join(RESUME_POINTS)} "
            f"(got {cfg.resume_points}).",
        ),
        (
            cfg.snapshots_per_conversation >= 0,
            f"{p}.snapshotsPerConversation must not be negative "
            f"(got {cfg.snapshots_per_conversation}).",
        ),
        (
            cfg.host_cache_gb >= 0,
            f"{p}.hostCacheGb must not be negative (0 = no host tier; got "
            f"{_num(cfg.host_cache_gb)}).",
        ),
        (
            cfg.disk_cache_dir is None or cfg.disk_cache_gb > 0,
            f"{p}.diskCacheGb must be positive when {p}.diskCacheDir is set (got "
            f"{_num(cfg.disk_cache_gb)}).",
        ),
        (
            cfg.disk_writeback in DISK_WRITEBACKS,
            f"{p}.diskWriteback must be one of {', '.join(DISK_WRITEBACKS)} "
            f"(got {cfg.disk_writeback}).",
        ),
        (
            cfg.disk_write_mb_per_s >= 0 and cfg.disk_read_ahead_mb >= 0,
            f"{p}.diskWriteMbPerS and {p}.diskReadAheadMb must not be negative (0: unpaced; "
            f"0: reads in the step; got {_num(cfg.disk_write_mb_per_s)} and "
            f"{cfg.disk_read_ahead_mb}).",
        ),
        (
            cfg.snapshot_slots >= 0,
            f"{p}.prefixCaching.snapshotSlots must not be negative (got {cfg.snapshot_slots}).",
        ),
        (
            _multiple(cfg.prefill_chunk, cfg.block_size),
            f"{p}.prefillChunk ({cfg.prefill_chunk}) must be a multiple of {p}.blockSize "
            f"({cfg.block_size}): prefill chunks end on block boundaries.",
        ),
        (
            (0 <= cfg.max_batch_size <= TTNN_MAX_BATCH) if ttnn else cfg.max_batch_size >= 0,
            f"{p}.maxBatchSize must be in 0..{TTNN_MAX_BATCH} on backend ttnn (0 = the "
            f"backend's default; got {cfg.max_batch_size})."
            if ttnn
            else f"{p}.maxBatchSize must not be negative (0 = the backend's default; got "
            f"{cfg.max_batch_size}).",
        ),
        (
            cfg.max_num_batched_tokens >= cfg.prefill_chunk,
            f"{p}.maxNumBatchedTokens ({cfg.max_num_batched_tokens}) must be at least "
            f"{p}.prefillChunk ({cfg.prefill_chunk}): one step must fit a whole chunk.",
        ),
        (cfg.max_waiting >= 0, f"{p}.maxWaiting must not be negative (got {cfg.max_waiting})."),
        (
            cfg.response_store_entries >= 0 and cfg.response_store_mb >= 0,
            f"{p}.responseStoreEntries and {p}.responseStoreMb must not be negative (got "
            f"{cfg.response_store_entries} and {cfg.response_store_mb}).",
        ),
        (
            cfg.max_prefill_rows >= 0,
            f"{p}.maxPrefillRows must not be negative (0 = the backend's default; got "
            f"{cfg.max_prefill_rows}).",
        ),
        (
            cfg.step_probe_seconds >= 0,
            f"{p}.stepProbeSeconds must not be negative (0: no startup probe; got "
            f"{_num(cfg.step_probe_seconds)}).",
        ),
        (
            cfg.kv_blocks == 0 or cfg.kv_blocks >= 2,
            f"{p}.kvBlocks must be 0 (size from memory) or at least 2 (block 0 is reserved "
            f"for padding; got {cfg.kv_blocks}).",
        ),
        (
            cfg.max_model_len >= 0,
            f"{p}.maxModelLen must not be negative (0 = the model's own; got {cfg.max_model_len}).",
        ),
        (
            cfg.trace_region_size >= 0,
            f"{p}.traceRegionSize must not be negative (0 = sized from the captured traces; "
            f"got {cfg.trace_region_size}).",
        ),
        (
            cfg.log_level in LOG_LEVELS,
            f"{p}.logLevel must be one of {', '.join(LOG_LEVELS)} (got {cfg.log_level}).",
        ),
        *_replica_rules(cfg, accelerated, where, chips),
    ]
    return [message for ok, message in rules if not ok]


def _replica_rules(
    cfg: ServeConfig, accelerated: bool, where: str, chips: int
) -> list[tuple[bool, str]]:
    """Drain bound and replica topology (appended to validate()'s rules, same order in Nix);
    ``chips``: the chips of ``cfg.mesh`` (0 when it is unset or malformed)."""
    p = NIX_PREFIX
    ttnn = cfg.backend == "ttnn"
    n, base, q = len(cfg.instances), cfg.worker_base_port, cfg.router_prometheus_port
    last = base + n - 1
    groups = ";".join(",".join(str(i) for i in g) for g in cfg.instances)
    flat = [i for g in cfg.instances for i in g]
    workers = f"the workers' ports {base}..{last}"
    return [
        (
            cfg.drain_timeout >= 1,
            f"{p}.drainTimeout must be at least 1 second (got {cfg.drain_timeout}).",
        ),
        (
            cfg.router_policy in ROUTER_POLICIES,
            f"{p}.routerPolicy must be one of {', '.join(ROUTER_POLICIES)} "
            f"(got {cfg.router_policy}).",
        ),
        (
            all(len(g) > 0 and min(g) >= 0 for g in cfg.instances),
            f"{p}.instances must be non-empty device groups of non-negative integers "
            f'(got "{groups}").',
        ),
        (
            len(set(flat)) == len(flat),
            f'{p}.instances must not use a device twice (got "{groups}").',
        ),
        (
            n == 0 or not accelerated or ttnn or all(len(g) == 1 for g in cfg.instances),
            f"{p}.instances must give each worker one device on a CUDA {p}.device "
            f'({where}; got "{groups}").',
        ),
        (
            n == 0 or not ttnn or not chips or all(len(g) == chips for g in cfg.instances),
            f'{p}.instances must give each worker one device per chip of {p}.mesh = "{cfg.mesh}" '
            f'({chips}) on backend ttnn (got "{groups}").',
        ),
        (
            n == 0 or (base >= 1 and last <= 65535),
            f"{p}.workerBasePort ({base}) leaves no room for {n} workers: ports {base}..{last} "
            "must be in 1..65535.",
        ),
        (
            n == 0 or not base <= cfg.port <= last,
            f"{p}.port ({cfg.port}) is the router's and must not be one of {workers}.",
        ),
        (
            n == 0 or (1 <= q <= 65535 and q != cfg.port and not base <= q <= last),
            f"{p}.routerPrometheusPort ({q}) must be in 1..65535 and differ from {p}.port "
            f"and {workers}.",
        ),
    ]


def _multiple(value: int, of: int) -> bool:
    return of > 0 and value % of == 0


def _distinct(cfg: ServeConfig) -> bool:
    return len(set(cfg.device_ids)) == len(cfg.device_ids)


def _num(value: float) -> str:
    """A number as Nix's ``toString`` writes it (ints plain, floats with six decimals)."""
    return str(value) if isinstance(value, int) else f"{value:.6f}"
