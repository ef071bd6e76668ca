"""The backend boundary: what the engine hands a backend and what it gets back.

A backend (torch in ``model/torch``, ttnn in ``model/tt``) owns every device tensor:
the paged KV pool, the GDN state slots and the GDN snapshot slots. The engine owns every
decision: which rows run, which blocks and slots they use, when snapshots are saved or
restored. Everything crossing this boundary is plain Python data (ints, tuples, numpy arrays
for host-sampled logits), so ``engine/`` and ``cache/`` never import torch.

Numbering: the engine uses GDN state slots ``0 .. num_state_slots - 1``, every one of them a
real sequence's; padding rows, scratch slots and device row order are a backend's own business.
KV block ``PAD_BLOCK`` (0, owned by ``cache/``) is never handed to a request: block tables are
padded with it and writes to it are garbage.

Pipelined decode (the one statement of the contract; other modules refer here). A
``PipelinedBackend`` with ``device_resident`` set also has ``submit``, which enqueues a step and
returns a ``PendingOutput`` whose ``result()`` blocks for the ids. The engine may submit step
n+1 before reading step n; a decode row of step n+1 then has ``fed=True`` and no token ids: its
one input token is "the id step n picked on the device for this state slot (argmax or a device
draw), still on the device". Fed and host-token rows may share a step (a row whose id the host
picks, e.g. under a grammar, skips the step after it and rejoins with its id).
  * A fed row is allowed only for a ``state_slot`` in the ``resident_slots`` of the step
    submitted immediately before, with no ``copy_states`` on that slot in between; a backend
    raises ValueError for any other use (``model/resident.py`` tracks this for every backend).
  * Results are read in submission order (``result()`` of step n before that of step n+1).
  * Devices execute in submission order, so KV blocks and state slots that the host frees while
    a step is in flight may be handed out again at once: the new owner's work runs after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tt_serve.cache.block_pool import PAD_BLOCK as PAD_BLOCK  # block tables are padded with it

if TYPE_CHECKING:
    import numpy as np


TOP_P_CANDIDATES = (1024, 16384)
"""Top-p looks for its nucleus among this many most likely tokens first (a linear-time
partition and a sort of the candidates, not of the vocabulary), then among the next count; only
a flatter distribution than that sorts everything (host sampler and torch draws alike)."""


@dataclass(frozen=True)
class RowSampling:
    """How the device draws a row's token when it is not greedy: exactly the host sampler's
    rules (``engine/sampler.py``, the reference), so a draw is a pure function of the logits and
    ``uniform``.

    Scale the logits by 1 / ``temperature``; keep the ``top_k`` largest (0: all; every token tied
    with the k-th stays); keep probabilities >= ``min_p`` x the largest; keep the smallest prefix
    of the tokens by descending probability (ties by id) whose mass reaches ``top_p`` of what is
    left; then pick, over the kept tokens in **id order**, the first whose cumulative probability
    exceeds ``uniform`` x their total. ``uniform`` in [0, 1) is drawn on the host from the
    request's own generator, one per token: a seeded request draws the same tokens whatever it
    is batched with and whichever path (device or host) picks each token.
    """

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    uniform: float = 0.0

    def __post_init__(self) -> None:
        if not self.temperature > 0.0 or not 0.0 <= self.uniform < 1.0:
            raise ValueError(
                f"RowSampling needs temperature > 0 and uniform in [0, 1) (got "
                f"{self.temperature}, {self.uniform})"
            )


@dataclass(frozen=True)
class StepRow:
    """One sequence's slice of work in a step.

    ``token_ids`` are computed at positions ``start_pos .. start_pos + len - 1``; their K/V are
    written through ``block_table`` (logical block i of the sequence is physical block
    ``block_table[i]``; padded with PAD_BLOCK) and the GDN layers read and update the state held
    in ``state_slot``. A row with ``sample`` set produces the next token from its last position:
    on the device (argmax, or a draw by ``sampling`` when it is set) unless ``want_logits`` asks
    for the raw logits so the engine can pick on the host. ``top_logprobs`` > 0 asks for the
    log-probabilities of the raw distribution for the chosen token and the top-k tokens,
    computed on the device for device-picked rows (host-picked rows compute them from the
    logits).
    """

    seq_id: int
    token_ids: tuple[int, ...]
    start_pos: int
    block_table: tuple[int, ...]
    state_slot: int
    sample: bool
    want_logits: bool = False
    top_logprobs: int = 0
    fed: bool = False
    sampling: RowSampling | None = None

    def __post_init__(self) -> None:
        if self.fed and (self.token_ids or not self.sample):
            raise ValueError(
                f"fed row for seq {self.seq_id}: a fed row carries no token ids and samples"
            )
        if self.sampling is not None and (self.want_logits or not self.sample):
            raise ValueError(
                f"row for seq {self.seq_id}: device sampling is for a sampling row whose token "
                "the device picks (not want_logits)"
            )

    @property
    def num_tokens(self) -> int:
        return 1 if self.fed else len(self.token_ids)

    @property
    def end_pos(self) -> int:
        return self.start_pos + self.num_tokens


@dataclass(frozen=True)
class StepBatch:
    """A step's rows. Block tables all have the same width (padded with PAD_BLOCK)."""

    rows: tuple[StepRow, ...]

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.rows)


@dataclass
class StepOutput:
    """Per-row results, indexed like ``StepBatch.rows``.

    ``token_ids[i]`` is the device-picked token of a sampling row (argmax, or its
    ``RowSampling`` draw), or None for rows that do not sample or asked for logits. ``logprobs[i]`` maps token id -> logprob (the chosen
    token plus the top-k) when asked. ``logits[i]`` holds float32 logits [vocab] for rows with
    ``want_logits``.
    """

    token_ids: list[int | None]
    logprobs: list[dict[int, float] | None] = field(default_factory=list)
    logits: dict[int, np.ndarray] = field(default_factory=dict)


class CopyKind(StrEnum):
    SAVE = "save"  # state slot -> snapshot slot
    RESTORE = "restore"  # snapshot slot -> state slot
    RESET = "reset"  # zero a state slot (fresh sequence)


@dataclass(frozen=True)
class StateCopy:
    """A GDN state copy (all GDN layers: conv and recurrent state together)."""

    kind: CopyKind
    slot: int
    snapshot: int = -1

    @staticmethod
    def save(slot: int, snapshot: int) -> StateCopy:
        return StateCopy(CopyKind.SAVE, slot, snapshot)

    @staticmethod
    def restore(snapshot: int, slot: int) -> StateCopy:
        return StateCopy(CopyKind.RESTORE, slot, snapshot)

    @staticmethod
    def reset(slot: int) -> StateCopy:
        return StateCopy(CopyKind.RESET, slot)


@runtime_checkable
class Backend(Protocol):
    """What every backend implements. All pools are allocated before any trace/graph capture."""

    def allocate(
        self,
        *,
        num_kv_blocks: int,
        block_size: int,
        num_state_slots: int,
        num_snapshot_slots: int,
    ) -> None:
        """Allocate the paged KV pool, the GDN state slots and the GDN snapshot slots.

        ``num_kv_blocks`` includes ``PAD_BLOCK``; ``num_state_slots`` counts the engine's slots
        only (a backend that needs a scratch slot for padding rows adds it itself).
        """
        ...

    def execute(self, batch: StepBatch) -> StepOutput:
        """Run one step. Must not keep references to ``batch`` after returning."""
        ...

    def copy_states(self, ops: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        """Apply GDN state copies in order (save / restore / reset)."""
        ...

    def close(self) -> None:
        """Release device resources (traces, device handles). Idempotent."""
        ...


@runtime_checkable
class UnitIO(Protocol):
    """A backend that moves resume-point units (``cache/tiers.py``) between its pools and host
    bytes: the KV of some blocks (every attention layer) and one GDN snapshot slot (every GDN
    layer). The encoding is the backend's own; a unit read by a backend restores exactly the
    same bits into a backend of the same model, dtype and precision."""

    def read_unit(self, blocks: Sequence[int], snapshot_slot: int) -> tuple[bytes, list[bytes]]:
        """The snapshot in ``snapshot_slot`` and the KV of each of ``blocks``, as bytes."""
        ...

    def write_unit(
        self,
        blocks: Sequence[int],
        block_data: Sequence[bytes],
        snapshot_slot: int,
        snapshot: bytes | None,
    ) -> None:
        """Write ``block_data`` into ``blocks`` and ``snapshot`` (unless None) into
        ``snapshot_slot``, ordered before the next step; ValueError for a payload of another
        size, before any write."""
        ...


def check_rows(rows: Iterable[StepRow], *, max_device_top_k: int = 0) -> None:
    """The checks every backend makes on a step's rows before any device work: ValueError for a
    row without tokens, or for a device draw whose top-k is outside ``1..max_device_top_k``
    (the backend's ``max_device_top_k``; 0 draws any top-k). Fed rows are ``ResidentSlots``'
    (``model/resident.py``)."""
    for row in rows:
        if row.num_tokens == 0:
            raise ValueError(f"row for seq {row.seq_id} has no tokens")
        if (
            max_device_top_k
            and row.sampling is not None
            and not 1 <= row.sampling.top_k <= max_device_top_k
        ):
            raise ValueError(
                f"row for seq {row.seq_id}: device draws need 1 <= top_k <= "
                f"{max_device_top_k} (got {row.sampling.top_k}); pick it on the host"
            )


def blocks_needed(row: StepRow, block_size: int) -> int:
    """How many blocks of ``row.block_table`` its positions reach (ValueError when the table
    holds fewer)."""
    need = -(-row.end_pos // block_size)
    if need > len(row.block_table):
        raise ValueError(
            f"seq {row.seq_id}: block table has {len(row.block_table)} blocks, "
            f"positions up to {row.end_pos} need {need}"
        )
    return need


def device_top_k_limit(backend: object) -> int:
    """The largest top-k ``backend`` draws on the device: its ``max_device_top_k`` (ttnn: 32,
    tt-metal's own limit), 0 for any top-k and rows without one (the torch backend, and a
    backend that does not say)."""
    return int(getattr(backend, "max_device_top_k", 0))


class PendingOutput(Protocol):
    """A submitted step. ``resident_slots``: state slots whose device-picked id this step leaves
    on the device, so the next step may have fed rows for them."""

    @property
    def resident_slots(self) -> frozenset[int]: ...

    def result(self) -> StepOutput:
        """Wait for the step and return its output (idempotent)."""
        ...


@runtime_checkable
class PipelinedBackend(Backend, Protocol):
    """A backend that can run ahead of the host: ``submit`` returns before the ids are read.

    ``device_resident`` says whether it keeps the picked ids on the device for fed rows; the
    engine pipelines decode steps only when it is set."""

    device_resident: bool

    def submit(self, batch: StepBatch) -> PendingOutput: ...


@dataclass(frozen=True)
class Launched:
    """A started backend (weights loaded, pools not yet allocated) and the KV pool size it was
    planned for: what ``model/launch.py`` hands the engine factory, whichever the backend."""

    backend: Backend
    num_kv_blocks: int  # the padding block included
