"""The serve configuration: one frozen dataclass, every option and its default, once.

:class:`ServeConfig` is what ``tt-serve serve``, ``LLM(**kw)``, the engine factory and the
backends read; the flags (:mod:`tt_serve.config.flags`), the rules
(:mod:`tt_serve.config.rules`) and the check-config JSON (:mod:`tt_serve.config.nix_json`) are
built on it. Defaults mirror ``modules/lib/defaults.nix`` (a test keeps them equal).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from typing import Any

GDN_CHUNK = 64
"""Chunk length of the Gated DeltaNet kernels; snapshot boundaries must fall on it."""

NIX_PREFIX = "services.tenstorrent-serving"
BACKENDS = ("torch", "ttnn")
DTYPES = ("auto", "float32", "bfloat16")
PRECISIONS = ("auto", "bfloat16", "mixed", "bfp4-mlp")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
RESUME_POINTS = ("messages", "chunks")
DISK_WRITEBACKS = ("resume", "all")  # cache/tiers.py WRITEBACK_POLICIES
"""Where prompts are cut and prefix-cache hits resume (``tt_serve/cache/resume.py``)."""
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")
"""sglang-router 0.3.2 policies the module offers (docs/routing.md says why cache_aware)."""
DEFAULT_BATCH = {"torch": 32, "ttnn": 16}
"""What max_batch_size 0 means per backend: torch serves 32 concurrent requests on a CPU without
queueing any (its step cost grows slowly with rows); ttnn's 16 keeps the decode trace and the
GDN state pool of a 9B within one chip at the default precision."""


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
        "weight precision profile, the same on both backends: bfloat16 (every weight bf16), "
        "mixed (attention, GDN, MLP, expert and LM-head weights bfloat8_b), bfp4-mlp (as mixed, "
        "MLP and expert weights bfloat4_b); auto: bfloat16 on ttnn, the checkpoint's float32 on "
        "torch (a profile on torch runs the CPU's block-float kernels)",
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
    # None (auto): on for torch on a CUDA device (graphed, pipelined decode and graphed
    # prefill are what a GPU user expects), off elsewhere; resolved_* says what runs.
    device_resident: bool | None = _opt(
        None,
        "pipelined decode: ids stay on the device between steps (needs device argmax); auto: "
        "on for torch on CUDA (with device argmax), off elsewhere",
        auto=True,
    )
    traced_prefill: bool | None = _opt(
        None,
        "capture prefill chunk buckets as traces (ttnn) or CUDA graphs (torch on CUDA); auto: on "
        "for torch on CUDA, off elsewhere",
        auto=True,
    )
    gpu_memory_utilization: float = _opt(
        0.9,
        "torch on CUDA: the fraction of the GPU's memory the server may hold (weights, graphs, "
        "activations and the KV pool, which takes what the rest leaves); kv-blocks overrides",
    )
    prefill_chunk: int = _opt(256, "prefill chunk size C (also a resume point every C tokens)")
    block_size: int = _opt(64, "KV block size in tokens (divides the prefill chunk)")
    kv_blocks: int = _opt(0, "KV pool size in blocks; 0 sizes it from memory")
    prefix_caching: bool = _opt(
        True, "the joint KV + GDN-snapshot prefix cache (off: cold control)"
    )
    snapshot_slots: int = _opt(32, "GDN snapshot slots of the prefix cache")
    resume_points: str = _opt(
        "messages",
        "where prompts are cut and cache hits resume: messages (chat message starts, the prompt "
        "end and chunk multiples) or chunks (chunk multiples only: the A/B control)",
        choices=RESUME_POINTS,
    )
    snapshots_per_conversation: int = _opt(
        8,
        "most GDN snapshots on one conversation's path (its message starts and chunk ends); "
        "past it the least valuable is evicted; 0: no cap",
    )
    host_cache_gb: float = _opt(
        0.0,
        "GiB of host memory for the host tier of the prefix cache: KV blocks and GDN snapshots "
        "written through as one unit per resume point, restored when the device pool lost "
        "them; 0: off",
    )
    disk_cache_dir: str | None = _opt(
        None,
        "folder of the disk tier: resume-point units as checksummed files, kept across "
        "restarts and shareable by replicas of the same model and precision; None: off",
    )
    disk_cache_gb: float = _opt(64.0, "GiB the disk tier may hold (with --disk-cache-dir)")
    disk_writeback: str = _opt(
        "resume",
        "which units go to the disk tier: resume (each request's first and last message cuts: "
        "the shared head and where its next turn resumes, plus any unit a host-tier restore "
        "reused) or all (every unit written through: the A/B control)",
        choices=DISK_WRITEBACKS,
    )
    disk_write_mb_per_s: float = _opt(
        256, "MiB per second the disk tier's write-back may write on average; 0: unpaced"
    )
    disk_read_ahead_mb: int = _opt(
        1024,
        "MiB of disk-tier units a reader thread may hold read or in flight for waiting "
        "requests, so the engine step never waits on the disk; 0: read in the step (the A/B "
        "control)",
    )
    response_store_entries: int = _opt(
        4096,
        "stored responses (the Responses API's store: previous_response_id continues from their "
        "exact token ids) kept at most, the least recently used evicted first; with "
        "--disk-cache-dir they are kept across restarts; 0: none",
    )
    response_store_mb: int = _opt(256, "MiB the stored responses may hold (ids and JSON)")
    max_batch_size: int = _opt(
        0, "running requests at once; 0 = the backend's default (32 on torch, 16 on ttnn)"
    )
    max_waiting: int = _opt(256, "waiting requests before new ones get 503")
    max_num_batched_tokens: int = _opt(2048, "tokens per engine step (at least one chunk)")
    max_prefill_rows: int = _opt(
        0,
        "requests advancing their prompt in one step, the earliest first (one chunk each): a "
        "burst's first tokens then come one after another instead of all at the end, but a long "
        "prompt admitted first holds the others' first tokens until its prefill ends; 0: the "
        "backend's default (ttnn 1; torch measures its own steps: 1 where a chunk's compute "
        "dwarfs a step's fixed cost, as on a CPU at the 0.8B shape, all of them where it does "
        "not); at least --max-batch-size: all of them, in lockstep",
    )
    step_probe_seconds: float = _opt(
        20.0,
        "seconds the startup may spend timing a few scratch steps for --max-prefill-rows 0 on "
        "torch (about 5 s at the 0.8B shape on 2 CPU cores, under 1 s on the demo model), so a "
        "fresh server's first burst already gets the measured rows; 0: none (the first burst "
        "then runs in lockstep until its own steps were timed)",
    )
    max_model_len: int = _opt(0, "context limit in tokens; 0 = the model's own")
    trace_region_size: int = _opt(
        0,
        "ttnn trace region in bytes (split over the DRAM banks); 0 sizes it from the traces "
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
    def on_cuda(self) -> bool:
        """The torch backend on a CUDA device."""
        return self.backend == "torch" and self.device.startswith("cuda")

    @property
    def resolved_device_resident(self) -> bool:
        """``device_resident``, auto (None) standing for on with torch on CUDA when device
        argmax is on (residency feeds the device's picks back), off elsewhere."""
        if self.device_resident is not None:
            return self.device_resident
        return self.on_cuda and self.device_argmax

    @property
    def resolved_traced_prefill(self) -> bool:
        """``traced_prefill``, auto (None) standing for on with torch on CUDA, off elsewhere."""
        return self.on_cuda if self.traced_prefill is None else self.traced_prefill

    @property
    def resolved_max_batch_size(self) -> int:
        """``max_batch_size``, 0 standing for the backend's default (DEFAULT_BATCH)."""
        return self.max_batch_size or DEFAULT_BATCH.get(self.backend, DEFAULT_BATCH["torch"])

    @property
    def resolved_precision(self) -> str:
        """The weight profile ``auto`` stands for: bfloat16 on ttnn, float32 (the checkpoint's
        own weights, no profile) on torch."""
        if self.precision != "auto":
            return self.precision
        return "bfloat16" if self.backend == "ttnn" else "float32"

    @property
    def mixed_steps(self) -> bool:
        """Decode rows and prefill chunks in one step: on torch on the CPU, where a prefill step
        costs in proportion to its tokens and reads the weights once, so running decodes ride
        in it almost for free. With one prefill row per step (the 0.8B shape on 2 cores, agent
        replay 8 x 6 in process) they cut the makespan from 377.9 to 347.0 s, first-token p50
        4.8 against 5.4 s; on the demo model (lockstep) makespan and p50 are unchanged
        (bench/runs/agent-replay.jsonl). Off on ttnn (its traces need all-prefill or
        all-decode steps) and on CUDA (its decode graphs), where a decode step runs after at
        most ``max_prefill_streak`` = 2 prefill steps."""
        return self.backend == "torch" and self.device == "cpu"

    @property
    def measured_prefill_rows(self) -> bool:
        """Whether the prefill rows per step are measured from the step times
        (``engine/prefill_rows.py``): torch's default."""
        return self.max_prefill_rows == 0 and self.backend == "torch"

    @property
    def resolved_max_prefill_rows(self) -> int:
        """The fixed cap on prefill rows per step (0: all; unused when measured). ttnn's
        default is 1: its prefill traces replay one row per chunk, so rows in one step add
        their whole cost and raise no throughput, and one row gives a burst its first tokens
        in turn."""
        return self.max_prefill_rows or (1 if self.backend == "ttnn" else 0)

    @property
    def num_snapshot_slots(self) -> int:
        return self.snapshot_slots if self.prefix_caching else 0

    def to_json_dict(self, *, resolved: bool = False) -> dict[str, Any]:
        """The configuration keyed by NixOS option names (the ``check-config`` format);
        ``resolved``: auto values replaced by what they stand for (``serve --dry-run``)."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if resolved and field.metadata.get("auto"):
                value = getattr(self, "resolved_" + field.name)
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
