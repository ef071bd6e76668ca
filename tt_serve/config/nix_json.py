"""Check-config JSON: a serve configuration keyed by NixOS option names, and its entry points.

JSON files for ``tt-serve check-config`` use the NixOS option names (camelCase, with
``prefixCaching = { enable; snapshotSlots; }`` nested), so ``builtins.toJSON`` of the module's
settings can be checked directly. ``serve --dry-run`` prints a configuration in the same
format (:meth:`ServeConfig.to_json_dict`).
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from tt_serve.config.rules import validate
from tt_serve.config.serve_config import NIX_PREFIX, ServeConfig

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


class ConfigError(ValueError):
    """A configuration file could not be read as a serve configuration."""


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
    "deviceResident": ("device_resident", (bool, type(None))),
    "tracedPrefill": ("traced_prefill", (bool, type(None))),
    "gpuMemoryUtilization": ("gpu_memory_utilization", (float, int)),
    "prefillChunk": ("prefill_chunk", (int,)),
    "blockSize": ("block_size", (int,)),
    "kvBlocks": ("kv_blocks", (int,)),
    "maxBatchSize": ("max_batch_size", (int,)),
    "maxWaiting": ("max_waiting", (int,)),
    "responseStoreEntries": ("response_store_entries", (int,)),
    "responseStoreMb": ("response_store_mb", (int,)),
    "maxNumBatchedTokens": ("max_num_batched_tokens", (int,)),
    "maxPrefillRows": ("max_prefill_rows", (int,)),
    "stepProbeSeconds": ("step_probe_seconds", (int, float)),
    "maxModelLen": ("max_model_len", (int,)),
    "traceRegionSize": ("trace_region_size", (int,)),
    "precision": ("precision", (str,)),
    "resumePoints": ("resume_points", (str,)),
    "snapshotsPerConversation": ("snapshots_per_conversation", (int,)),
    "hostCacheGb": ("host_cache_gb", (int, float)),
    "diskCacheDir": ("disk_cache_dir", (str, type(None))),
    "diskCacheGb": ("disk_cache_gb", (int, float)),
    "diskWriteback": ("disk_writeback", (str,)),
    "diskWriteMbPerS": ("disk_write_mb_per_s", (int, float)),
    "diskReadAheadMb": ("disk_read_ahead_mb", (int,)),
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
    """``serve --dry-run``: print the config as check-config JSON with every auto value
    resolved (exit 0), or the violations."""
    errors = validate(cfg)
    if errors:
        for message in errors:
            print(message, file=err if err is not None else sys.stderr)
        return 1
    doc = cfg.to_json_dict(resolved=True)
    print(json.dumps(doc, indent=2, sort_keys=True), file=out or sys.stdout)
    return 0
