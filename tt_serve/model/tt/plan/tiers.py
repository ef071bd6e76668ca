"""How many agents' conversations a deployment keeps warm: the device pool, host memory and disk.

An agent's conversation at context C is resumable from a tier when the tier holds the KV of its
C tokens and one GDN snapshot at C (the joint unit of the prefix cache: KV without the paired
recurrent state is worthless). Its size is what the device stores for it: ``ceil(C / block)``
KV blocks of every attention layer and one snapshot slot of every GDN layer, in the profile's KV
and state dtypes and the device's TILE layout (the host and disk tiers keep those bytes as they
are, so a restore is a copy, not a conversion), over the distinct shards of the mesh: a KV head
replicated on several chips (more chips than KV heads) is kept once.

* device: the KV pool's blocks and the snapshot slots bound the conversations it holds;
* host / disk: ``--host-cache-gb`` / ``--disk-cache-gb`` (GiB, as ``tt-serve serve`` takes
  them) divided by the conversation's size. The tiers are inclusive (every unit is written
  through from the device to host and on to disk), so the conversations kept warm are the most
  any one tier holds, not their sum;
* a restore of one conversation from host memory crosses the box's PCIe links
  (``boards.HostLink``): each chip's share over its card's link, the links in parallel; the
  time is given at the links' line rate and, where tt-metal published one, at its measured
  host -> device figure. Disk restores add the disk's read time, which the plan cannot know.

The target shapes are the workloads the stack is built for: 8 agents x 128k and 4 x 256k.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tt_serve.model.tt.boards import DeviceSpec
from tt_serve.model.tt.options import Target
from tt_serve.model.tt.plan.planner import Plan

GB = 1e9
GIB = 1 << 30  # --host-cache-gb and --disk-cache-gb count GiB, as the server's flags do


@dataclass(frozen=True)
class AgentShape:
    """``agents`` concurrent conversations of ``context`` tokens each."""

    agents: int
    context: int

    @staticmethod
    def parse(text: str) -> AgentShape:
        """``"8x131072"`` or ``"8x128k"``."""
        try:
            n, ctx = text.lower().split("x")
            tokens = int(ctx[:-1]) * 1024 if ctx.endswith("k") else int(ctx)
            shape = AgentShape(int(n), tokens)
        except ValueError as exc:
            raise ValueError(f"agent shape {text!r}: expected AGENTSxCONTEXT, e.g. 8x128k") from exc
        if shape.agents < 1 or shape.context < 1:
            raise ValueError(f"agent shape {text!r}: agents and context must be positive")
        return shape

    def __str__(self) -> str:
        ctx = self.context
        return f"{self.agents} x {ctx // 1024}k" if ctx % 1024 == 0 else f"{self.agents} x {ctx}"


TARGETS = (AgentShape(8, 128 * 1024), AgentShape(4, 256 * 1024))


@dataclass(frozen=True)
class TierFit:
    """Where ``shape``'s conversations live, and what a restore of one costs."""

    shape: AgentShape
    kv_bytes: int  # one conversation's KV, all chips
    snapshot_bytes: int  # one GDN snapshot, all chips
    runs: bool  # one conversation of this context fits the device at all (max context)
    device: int  # conversations the device pool holds
    host: int  # ... host memory holds (0 without a host tier)
    disk: int  # ... the disk tier holds
    restore_peak_s: float | None  # one conversation from host memory at the links' line rate
    restore_measured_s: float | None  # ... at tt-metal's measured host -> device figure

    @property
    def agent_bytes(self) -> int:
        return self.kv_bytes + self.snapshot_bytes

    @property
    def held(self) -> int:
        """Conversations kept warm: the tiers are inclusive (written through), so the most any
        one of them holds."""
        return max(self.device, self.host, self.disk)

    @property
    def fits(self) -> bool:
        return self.runs and self.held >= self.shape.agents

    @property
    def tier_bytes(self) -> int:
        """Bytes a host or disk tier needs to keep every agent warm (a copy of each, the
        device's too: written through)."""
        return self.shape.agents * self.agent_bytes


def fit(
    p: Plan,
    board: DeviceSpec,
    block_size: int,
    shape: AgentShape,
    *,
    host_gb: float = 0.0,
    disk_gb: float = 0.0,
    kv_shards: int = 1,
    state_shards: int = 1,
) -> TierFit:
    """``shape`` against a fitting plan ``p`` of ``board`` (its KV blocks and snapshot slots).
    ``kv_shards`` / ``state_shards``: the distinct pieces the mesh splits the KV heads and the
    GDN heads into (the rest of its chips hold copies)."""
    if not p.ok or p.pools is None or p.kv_blocks == 0:
        raise ValueError("tier fit needs a plan that fits")
    blocks = math.ceil(shape.context / block_size)
    kv_chip = p.kv_bytes * blocks // p.kv_blocks  # p.kv_bytes: one chip's pool
    slots = p.pools.num_snapshot_slots
    snap_chip = p.snapshot_bytes // slots if slots else 0
    kv, snap = kv_chip * kv_shards, snap_chip * state_shards
    agent = kv + snap
    device = min(p.kv_blocks // blocks, slots)
    link = board.host_link
    peak = measured = None
    if link is not None:
        # each link carries the share of the chips behind it; the links run in parallel
        per_link = (kv_chip + snap_chip) * math.ceil(p.chips / link.links)
        peak = per_link / (link.peak_gbps * GB)
        measured = per_link / (link.measured_gbps * GB) if link.measured_gbps else None
    return TierFit(
        shape=shape,
        kv_bytes=kv,
        snapshot_bytes=snap,
        runs=shape.context <= p.max_context,
        device=device,
        host=int(host_gb * GIB // agent),
        disk=int(disk_gb * GIB // agent),
        restore_peak_s=peak,
        restore_measured_s=measured,
    )


def fits(
    p: Plan,
    target: Target,
    block_size: int,
    shapes: Sequence[AgentShape] = TARGETS,
    *,
    host_gb: float = 0.0,
    disk_gb: float = 0.0,
) -> list[TierFit]:
    """Every shape against the plan of ``target`` (its board and tensor-parallel split)."""
    tp, board = target.tp, target.board
    assert board is not None
    kv_shards = tp.spec.num_kv_heads // tp.kv_heads
    return [
        fit(
            p,
            board,
            block_size,
            s,
            host_gb=host_gb,
            disk_gb=disk_gb,
            kv_shards=kv_shards,
            state_shards=tp.cols,
        )
        for s in shapes
    ]


def _gb(n: float) -> str:
    return f"{n / GB:.2f} GB"


def format_tiers(rows: Sequence[TierFit], board: DeviceSpec) -> Iterator[str]:
    """The plan's tier lines: one conversation's size, where each shape's agents live, and the
    restore time of one conversation over the host link."""
    link = board.host_link
    for i, r in enumerate(rows):
        head = "  tiers        " if i == 0 else "               "
        yield (
            f"{head}{r.shape}: one conversation {_gb(r.agent_bytes)} (KV {_gb(r.kv_bytes)} + "
            f"GDN snapshot {_gb(r.snapshot_bytes)})"
        )
        if not r.runs:
            yield f"               {r.shape.context} tokens exceed the device's max context"
            continue
        room = f"device {r.device}"
        if r.host or r.disk:
            room += f", host {r.host}, disk {r.disk}"
        if r.fits:
            verdict = f"all {r.shape.agents} warm"
        else:
            verdict = (
                f"{r.shape.agents - r.held} of {r.shape.agents} recompute their history; "
                f"{r.tier_bytes / GIB:.1f} GiB of --host-cache-gb or --disk-cache-gb keeps all "
                "warm"
            )
        yield f"               room for {room} conversations (inclusive tiers): {verdict}"
        if link is not None and r.restore_peak_s is not None:
            measured = (
                f", {r.restore_measured_s:.2f} s at tt-metal's measured {link.measured_gbps:g} GB/s"
                if r.restore_measured_s is not None
                else ""
            )
            yield (
                f"               restore of one from host: {r.restore_peak_s:.3f} s over "
                f"{link.describe()} at {link.peak_gbps:.1f} GB/s per link{measured}"
            )
        else:
            yield "               restore time: no published host-link figure for this box"
