"""The ttnn start's options: ``ServeConfig`` read once into one typed object, and where the
start runs, worked out once.

``TTOptions`` is everything a ttnn start reads from the configuration (precision, pools,
tracing, residency, mesh, ...). Both builds of a start take the same object: the planner's
shape-only build (``plan/planner.py``) and the real one (``launch.py`` -> ``runtime/build.py``),
so an option added here reaches both or neither, and the plan cannot drift from the start.

``Target`` is where the start runs: the board, the mesh its chips form, the tensor-parallel
split over that mesh and the CCL links per axis, computed once per start and handed to every
build of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tt_serve.config.serve_config import DEFAULT_BATCH, ServeConfig, mesh_shape
from tt_serve.model.precision import Precision
from tt_serve.model.tt.boards import DeviceSpec
from tt_serve.model.tt.layout.experts import MoeDispatch
from tt_serve.model.tt.layout.parallel import TensorParallel

if TYPE_CHECKING:
    from tt_serve.model.spec import ModelSpec

_D = ServeConfig()  # the defaults are ServeConfig's, stated there once

DEFAULT_CCL_LINKS = 1  # tt_transformers get_num_links: 1 on N300/T3K, 2 on P150x4 (both work)


@dataclass(frozen=True)
class TTOptions:
    """What a ttnn start reads from the configuration (defaults: ``ServeConfig``'s)."""

    precision: str = ServeConfig(backend="ttnn").resolved_precision  # ``Precision.named``
    max_batch_size: int = DEFAULT_BATCH["ttnn"]  # state slots = decode rows
    prefill_chunk: int = _D.prefill_chunk  # the largest prefill bucket
    block_size: int = _D.block_size
    snapshot_slots: int = _D.snapshot_slots
    kv_blocks: int = _D.kv_blocks  # 0: sized from DRAM by the plan
    max_model_len: int = _D.max_model_len  # 0: the model's own; sizes the traces' page tables
    trace_region_size: int = _D.trace_region_size  # 0: sized from the captured traces
    traced_prefill: bool = _D.resolved_traced_prefill  # replay captured prefill traces
    traced_decode: bool = True  # replay the captured decode trace (False: eager, debugging)
    device_resident: bool = (
        _D.resolved_device_resident
    )  # picked ids stay on the device for fed rows
    moe_dispatch: MoeDispatch = "sparse"  # only the routed experts; "dense": all (reference)
    mesh: tuple[int, int] | None = None  # None: 1 x the number of device ids (a start), or
    # the device's own mesh (a plan)
    device_ids: tuple[int, ...] = _D.device_ids

    def __post_init__(self) -> None:
        Precision.named(self.precision)  # ValueError naming the profiles

    @staticmethod
    def from_config(cfg: ServeConfig, *, max_model_len: int | None = None) -> TTOptions:
        """The options ``cfg`` gives a ttnn start; ``max_model_len``: the engine's resolved
        context limit (the model's own when ``cfg.max_model_len`` is 0)."""
        return TTOptions(
            precision=cfg.resolved_precision,
            max_batch_size=cfg.resolved_max_batch_size,
            prefill_chunk=cfg.prefill_chunk,
            block_size=cfg.block_size,
            snapshot_slots=cfg.num_snapshot_slots,
            kv_blocks=cfg.kv_blocks,
            max_model_len=cfg.max_model_len if max_model_len is None else max_model_len,
            trace_region_size=cfg.trace_region_size,
            traced_prefill=cfg.resolved_traced_prefill,
            device_resident=cfg.resolved_device_resident,
            mesh=mesh_shape(cfg),
            device_ids=cfg.device_ids,
        )

    @property
    def weights(self) -> Precision:
        """The weight profile as the layout and pools read it."""
        return Precision.named(self.precision)

    def replace(self, **changes: Any) -> TTOptions:
        """A copy with ``changes`` (of the same class: an option added in a subclass stays)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TTOptions:
        """The inverse of ``to_json`` (tuples come back as JSON lists)."""
        data = dict(data)
        if data.get("mesh") is not None:
            data["mesh"] = (int(data["mesh"][0]), int(data["mesh"][1]))
        if "device_ids" in data:
            data["device_ids"] = tuple(int(i) for i in data["device_ids"])
        return cls(**data)


@dataclass(frozen=True)
class Target:
    """Where a start runs, worked out once: the board (None: an unknown box that is started
    with every size given), the mesh, the tensor-parallel split over it and the CCL links
    per axis (tt_transformers' get_num_links: 2 on P150x4 / P300, 4 and 3 on a Galaxy)."""

    board: DeviceSpec | None
    mesh: tuple[int, int]
    tp: TensorParallel
    links: int | tuple[int, int]

    @staticmethod
    def of(spec: ModelSpec, board: DeviceSpec | None, opts: TTOptions) -> Target:
        """``opts.mesh`` on ``board`` (None: the board's own mesh, or one chip without a
        board); ValueError when the model does not split over it."""
        mesh = opts.mesh or (board.mesh if board is not None else (1, len(opts.device_ids)))
        tp = TensorParallel.for_mesh(spec, mesh) if mesh != (1, 1) else TensorParallel(spec, 1)
        if board is None:
            links: int | tuple[int, int] = DEFAULT_CCL_LINKS
        else:
            links = board.links_on(mesh)
        return Target(board, mesh, tp, links)
