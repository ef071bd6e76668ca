"""Serve configuration: one frozen dataclass, the ``serve`` flags, and the invariant rule set.

The rules in :func:`validate` are the same rules, with the same messages, as the NixOS
assertions in ``modules/lib/invariants.nix``; ``tests/nix`` evaluates both over one truth table
and requires identical verdicts. Messages name options by their NixOS names
(``services.tenstorrent-serving.<option>``) so that a deployment error and a CLI error read the
same. Defaults mirror ``modules/lib/defaults.nix`` (a test keeps them equal).

JSON files for ``tt-serve check-config`` use the NixOS option names (camelCase, with
``prefixCaching = { enable; snapshotSlots; }`` nested), so ``builtins.toJSON`` of the module's
settings can be checked directly.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from dataclasses import dataclass
from typing import Any, TextIO

GDN_CHUNK = 64
"""Chunk length of the Gated DeltaNet kernels; snapshot boundaries must fall on it."""

NIX_PREFIX = "services.tenstorrent-serving"
BACKENDS = ("torch", "ttnn")
DTYPES = ("auto", "float32", "bfloat16")
PRECISIONS = ("auto", "bfloat16", "mixed", "bfp4-mlp")
# Mesh sides tensor parallel opens (tt-metal's MESH_DEVICE shapes: (1, 2), (1, 4), (1, 8), (2, 4)
# on T3K, (8, 4) / (4, 8) on Galaxy); the model's own splits are checked at startup
# (model/tt/layout/parallel.py).
MESH_SIDES = (1, 2, 4, 8)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
"""sglang-router 0.3.2 policies the module offers (docs/routing.md says why cache_aware)."""
TTNN_MAX_BATCH = 32
DEFAULT_BATCH = {"torch": 32, "ttnn": 16}
"""What max_batch_size 0 means per backend: torch serves 32 concurrent requests on a CPU without
queueing any (its step cost grows slowly with rows); ttnn's 16 keeps the decode trace and the
GDN state pool of a 9B within one chip at the default precision."""
TTNN_BLOCK_ALIGN = 32
"""ttnn stores paged KV in TILE layout (32 x 32), so a KV block holds whole tile rows."""

# Module-only NixOS options: accepted in check-config files, meaningless to the server.
MODULE_ONLY_KEYS = frozenset(
    {
        "enable",
        "package",
        "openFirewall",
        "extraArgs",
        "environment",
        "hugepages",
        "kernelDriver",
        "preStartCheck",
        "startTimeoutMinutes",
        "routerPackage",
        "routerExtraArgs",
        "rollingRestart",
    }
)
_CUDA_DEVICE = re.compile(r"cuda(:[0-9]+)?")


class ConfigError(ValueError):
    """A configuration file could not be read as a serve configuration."""


def _opt(default: Any, help: str, **extra: Any) -> Any:
    """A ServeConfig field: its default and its ``--help`` line live here and nowhere else."""
    return dataclasses.field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``tt-serve serve`` (and ``LLM``) needs to start: the one place defaults live.

    No I/O and no derived defaults computed elsewhere: the CLI flags, ``--help``, ``LLM(**kw)``,
    the engine factory and the backends all read this object; ``modules/lib/defaults.nix``
    holds the same values (a test keeps them equal).
    """

    model: str | None = _opt(None, "HF checkpoint folder; None: the generated demo model")
    served_model_name: str | None = _opt(None, "model name in the API; None: the folder name")
    host: str = _opt("127.0.0.1", "address to listen on")
    port: int = _opt(8000, "port to listen on")
    backend: str = _opt("torch", "torch (CPU/CUDA) or ttnn (Tenstorrent)", choices=BACKENDS)
    device: str = _opt("cpu", "torch backend device: cpu, cuda or cuda:N")
    device_ids: tuple[int, ...] = _opt(
        (0,), "ttnn backend: the Tenstorrent device ids the server opens as one mesh"
    )
    mesh: str = _opt(
        "",
        "ttnn backend: the mesh shape ROWSxCOLS the device ids form (1x2 on N300, 1x4 on 4xP150, "
        "1x8 or 2x4 on T3K, 8x4 on Galaxy); empty: 1 x the number of ids",
    )
    dtype: str = _opt(
        "auto",
        "compute dtype: auto = float32 for torch on the CPU, bfloat16 elsewhere",
        choices=DTYPES,
    )
    precision: str = _opt(
        "auto",
        "ttnn weight precision profile: auto (bfloat16 today), bfloat16 (every weight bf16), "
        "mixed (attention, GDN, MLP, expert and LM-head weights bfloat8_b), bfp4-mlp (as mixed, "
        "MLP and expert weights bfloat4_b)",
        choices=PRECISIONS,
    )
    device_argmax: bool = _opt(
        True, "pick greedy tokens on the device (off: greedy from the logits on the host)"
    )
    device_sampling: bool = _opt(
        True,
        "draw temperature / top-k / top-p / min-p tokens on the device from host-drawn uniforms "
        "(off: their logits come to the host every step; with device argmax off every token is "
        "picked on the host)",
    )
    device_resident: bool = _opt(
        False, "pipelined decode: ids stay on the device between steps (needs device argmax)"
    )
    traced_prefill: bool = _opt(
        False, "capture prefill chunk buckets as traces (ttnn) or CUDA graphs (torch on CUDA)"
    )
    prefill_chunk: int = _opt(256, "prefill chunk size C (= the snapshot stride)")
    block_size: int = _opt(64, "KV block size in tokens (divides the prefill chunk)")
    kv_blocks: int = _opt(0, "KV pool size in blocks; 0 sizes it from memory")
    prefix_caching: bool = _opt(
        True, "the joint KV + GDN-snapshot prefix cache (off: cold control)"
    )
    snapshot_slots: int = _opt(32, "GDN snapshot slots of the prefix cache")
    max_batch_size: int = _opt(
        0, "running requests at once; 0 = the backend's default (32 on torch, 16 on ttnn)"
    )
    max_waiting: int = _opt(256, "waiting requests before new ones get 503")
    max_num_batched_tokens: int = _opt(2048, "tokens per engine step (at least one chunk)")
    max_model_len: int = _opt(0, "context limit in tokens; 0 = the model's own")
    trace_region_size: int = _opt(
        0,
        "ttnn trace region in bytes (reserved in every DRAM bank); 0 sizes it from the traces "
        "the backend captures (1.5x the estimate, whole 16 MiB)",
    )
    api_key_file: str | None = _opt(None, "require Authorization: Bearer <key> on /v1/*")
    log_level: str = _opt("info", "log level", choices=LOG_LEVELS)
    drain_timeout: int = _opt(
        30,
        "seconds SIGTERM waits for requests in flight (new ones get 503) before the server exits",
    )
    # The replica topology (NixOS module and scripts/serve-replicas): no `serve` flags, since
    # one server is one replica; validate() still checks them with the rest.
    instances: tuple[tuple[int, ...], ...] = _opt(
        (), "device groups, one worker each, behind a router; empty: one server", flag=False
    )
    worker_base_port: int = _opt(8100, "worker i listens on 127.0.0.1:(this + i)", flag=False)
    router_policy: str = _opt(
        "cache_aware", "the router's policy", choices=ROUTER_POLICIES, flag=False
    )
    router_prometheus_port: int = _opt(
        29000, "the router's Prometheus port (on 127.0.0.1)", flag=False
    )

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ServeConfig:
        """Build from a namespace parsed by a parser that :func:`add_serve_arguments` filled."""
        values = {f.name: getattr(ns, f.name) for f in serve_flag_fields()}
        values["device_ids"] = tuple(values["device_ids"])
        return cls(**values)

    @classmethod
    def from_kwargs(cls, caller: str, **kwargs: Any) -> ServeConfig:
        """Keyword arguments named like the fields (``LLM(**kwargs)``); unknown ones raise."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"{caller} got unknown keyword(s): {', '.join(unknown)}")
        if "device_ids" in kwargs:
            kwargs["device_ids"] = tuple(kwargs["device_ids"])
        return cls(**kwargs)

    @property
    def resolved_dtype(self) -> str:
        """``auto`` is float32 for torch on the CPU and bfloat16 everywhere else."""
        if self.dtype != "auto":
            return self.dtype
        return "float32" if self.backend == "torch" and self.device == "cpu" else "bfloat16"

    @property
    def resolved_max_batch_size(self) -> int:
        """``max_batch_size``, 0 standing for the backend's default (DEFAULT_BATCH)."""
        return self.max_batch_size or DEFAULT_BATCH.get(self.backend, DEFAULT_BATCH["torch"])

    @property
    def resolved_precision(self) -> str:
        """The ttnn weight profile ``auto`` stands for."""
        return "bfloat16" if self.precision == "auto" else self.precision

    @property
    def mixed_steps(self) -> bool:
        """Decode rows and prefill chunks in one step: off on both backends (ttnn traces need
        all-prefill or all-decode steps). On torch, prefill-first steps (decodes wait at most
        ``max_prefill_streak`` = 2 prefill steps, as SGLang's default) gave a burst of 32
        256-token prompts a lower max TTFT than mixed steps in 10 of 10 interleaved rounds
        (median 1.09 s against 1.17 s on 2 cores, equal tokens/s: ``python -m
        bench.step_policy``, bench/runs/step-policy.jsonl). The cost: while a burst prefills,
        a running decode's longest gap is two prefill steps instead of one."""
        return False

    @property
    def num_snapshot_slots(self) -> int:
        return self.snapshot_slots if self.prefix_caching else 0

    def to_json_dict(self) -> dict[str, Any]:
        """The configuration keyed by NixOS option names (the ``check-config`` format)."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "prefix_caching":
                out["prefixCaching"] = {"enable": value, "snapshotSlots": self.snapshot_slots}
            elif field.name != "snapshot_slots":
                out[_nix_name(field.name)] = _json_value(value)
        return out


def serve_flag_fields() -> list[dataclasses.Field[Any]]:
    """The fields that are `tt-serve serve` flags (all but the replica topology)."""
    return [f for f in dataclasses.fields(ServeConfig) if f.metadata.get("flag", True)]


def _json_value(value: Any) -> Any:
    return [_json_value(v) for v in value] if isinstance(value, tuple) else value


def _nix_name(field_name: str) -> str:
    head, *rest = field_name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _device_ids(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of ints: {text!r}"
        ) from exc


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Define one ``tt-serve serve`` flag per ServeConfig field, with its help and default."""
    for f in serve_flag_fields():
        flag = "--" + f.name.replace("_", "-")
        meta = f.metadata
        shown = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
        help_text = f"{meta['help']} (default: {shown})"
        kw: dict[str, Any] = {"default": f.default, "help": help_text}
        if isinstance(f.default, bool):
            kw["action"] = argparse.BooleanOptionalAction
        elif f.name == "device_ids":
            kw["type"] = _device_ids
        elif isinstance(f.default, int):
            kw["type"] = int
        if "choices" in meta:
            kw["choices"] = meta["choices"]
        parser.add_argument(flag, **kw)
    parser.add_argument(
        "--dry-run", action="store_true", help="validate, print the resolved config, exit"
    )


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
            ttnn or cfg.precision == "auto",
            f'{p}.precision selects a ttnn weight profile; it needs {p}.backend = "ttnn" '
            f"(got backend {cfg.backend}, precision {cfg.precision}).",
        ),
        (
            not cfg.device_resident or cfg.device_argmax,
            f"{p}.deviceResident = true requires {p}.deviceArgmax = true "
            "(the decode loop feeds sampled ids back on the device; logits never leave it).",
        ),
        (
            not cfg.device_resident or accelerated,
            f'{p}.deviceResident = true needs {p}.backend = "ttnn" or a CUDA {p}.device ({where}).',
        ),
        (
            not cfg.traced_prefill or accelerated,
            f'{p}.tracedPrefill = true needs {p}.backend = "ttnn" or a CUDA {p}.device ({where}).',
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


MESH_PATTERN = re.compile(r"([1-9][0-9]*)x([1-9][0-9]*)")


def parse_mesh(text: str) -> tuple[int, int] | None:
    """``ROWSxCOLS`` -> (rows, cols); None when malformed."""
    m = MESH_PATTERN.fullmatch(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def mesh_shape(cfg: ServeConfig) -> tuple[int, int]:
    """The mesh the ttnn backend opens: ``cfg.mesh``, or 1 x the number of device ids."""
    shape = parse_mesh(cfg.mesh) if cfg.mesh else (1, len(cfg.device_ids))
    if shape is None:
        raise ValueError(f"mesh {cfg.mesh!r} is not ROWSxCOLS")
    return shape


def _distinct(cfg: ServeConfig) -> bool:
    return len(set(cfg.device_ids)) == len(cfg.device_ids)


# JSON key -> (dataclass field, accepted JSON types). bool is excluded from int on purpose.
_JSON_FIELDS: dict[str, tuple[str, tuple[type, ...]]] = {
    "model": ("model", (str, type(None))),
    "servedModelName": ("served_model_name", (str, type(None))),
    "host": ("host", (str,)),
    "port": ("port", (int,)),
    "backend": ("backend", (str,)),
    "device": ("device", (str,)),
    "deviceIds": ("device_ids", (list,)),
    "mesh": ("mesh", (str,)),
    "dtype": ("dtype", (str,)),
    "deviceArgmax": ("device_argmax", (bool,)),
    "deviceSampling": ("device_sampling", (bool,)),
    "deviceResident": ("device_resident", (bool,)),
    "tracedPrefill": ("traced_prefill", (bool,)),
    "prefillChunk": ("prefill_chunk", (int,)),
    "blockSize": ("block_size", (int,)),
    "kvBlocks": ("kv_blocks", (int,)),
    "maxBatchSize": ("max_batch_size", (int,)),
    "maxWaiting": ("max_waiting", (int,)),
    "maxNumBatchedTokens": ("max_num_batched_tokens", (int,)),
    "maxModelLen": ("max_model_len", (int,)),
    "traceRegionSize": ("trace_region_size", (int,)),
    "precision": ("precision", (str,)),
    "apiKeyFile": ("api_key_file", (str, type(None))),
    "logLevel": ("log_level", (str,)),
    "drainTimeout": ("drain_timeout", (int,)),
    "instances": ("instances", (list,)),
    "workerBasePort": ("worker_base_port", (int,)),
    "routerPolicy": ("router_policy", (str,)),
    "routerPrometheusPort": ("router_prometheus_port", (int,)),
}
_PREFIX_CACHING_FIELDS = {
    "enable": ("prefix_caching", bool),
    "snapshotSlots": ("snapshot_slots", int),
}


def config_from_json_dict(data: Any) -> ServeConfig:
    """Build a config from NixOS-named keys; unknown keys and wrong types raise ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError("a configuration must be a JSON object")
    known = set(_JSON_FIELDS) | {"prefixCaching"} | MODULE_ONLY_KEYS
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown option(s): {', '.join(f'{NIX_PREFIX}.{k}' for k in unknown)}")
    values: dict[str, Any] = {}
    for key, (field, types) in _JSON_FIELDS.items():
        if key in data:
            values[field] = _typed(key, data[key], types)
    if "device_ids" in values:
        values["device_ids"] = tuple(_typed("deviceIds", i, (int,)) for i in values["device_ids"])
    if "instances" in values:
        values["instances"] = tuple(
            tuple(_typed("instances", i, (int,)) for i in _typed("instances", g, (list,)))
            for g in values["instances"]
        )
    pc = data.get("prefixCaching", {})
    if not isinstance(pc, dict):
        raise ConfigError(f"{NIX_PREFIX}.prefixCaching must be an object")
    bad = sorted(set(pc) - set(_PREFIX_CACHING_FIELDS))
    if bad:
        names = ", ".join(f"{NIX_PREFIX}.prefixCaching.{k}" for k in bad)
        raise ConfigError(f"unknown option(s): {names}")
    for key, (field, typ) in _PREFIX_CACHING_FIELDS.items():
        if key in pc:
            values[field] = _typed(f"prefixCaching.{key}", pc[key], (typ,))
    return ServeConfig(**values)


def _typed(key: str, value: Any, types: tuple[type, ...]) -> Any:
    # JSON true/false are ints to Python; an int option must not accept them.
    is_bool_for_int = isinstance(value, bool) and bool not in types
    if is_bool_for_int or not isinstance(value, types):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise ConfigError(f"{NIX_PREFIX}.{key} must be {names} (got {json.dumps(value)})")
    return value


def load_config_json(path: str) -> ServeConfig:
    """Read a ``check-config`` JSON file (I/O lives here, not in the dataclass)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    return config_from_json_dict(data)


def check_config_main(path: str, out: TextIO | None = None) -> int:
    """``tt-serve check-config FILE``: print OK (exit 0), each violation (exit 1), or the file
    error (exit 2)."""
    stream = out if out is not None else sys.stdout
    try:
        cfg = load_config_json(path)
    except ConfigError as exc:
        print(f"error: {exc}", file=stream)
        return 2
    errors = validate(cfg)
    for message in errors:
        print(message, file=stream)
    if not errors:
        print("OK", file=stream)
    return 1 if errors else 0


def dry_run(cfg: ServeConfig, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``serve --dry-run``: print the config as check-config JSON (exit 0) or the violations."""
    errors = validate(cfg)
    if errors:
        for message in errors:
            print(message, file=err if err is not None else sys.stderr)
        return 1
    print(json.dumps(cfg.to_json_dict(), indent=2, sort_keys=True), file=out or sys.stdout)
    return 0
