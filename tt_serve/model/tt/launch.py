"""A ttnn start, once and in one direction (as vLLM's ``EngineCore._initialize_kv_caches`` and
nano-vllm's ``ModelRunner.__init__`` start theirs):

    ServeConfig -> TTOptions (once: ``options.py``)
    -> identify the box (its ClusterType, asked before anything opens) -> Target (once:
       board, mesh, tensor-parallel split, CCL links)
    -> plan the trace region and the KV pool on the virtual device of that box, from the same
       TTOptions and Target
    -> open the device or mesh with that trace region
    -> build from the same TTOptions: layout -> upload (cached) -> model -> backend
    -> hand the engine factory the backend and the pool size it allocates.

Only this module and the planner know the virtual device; the runtime never imports either.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tt_serve.model.interface import Launched
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import DeviceSpec, board_for_cluster
from tt_serve.model.tt.layout.host import to_numpy
from tt_serve.model.tt.ops import DEFAULT_L1_SMALL, Ops
from tt_serve.model.tt.options import Target, TTOptions
from tt_serve.model.tt.runtime.backend import TTBackend
from tt_serve.model.tt.runtime.build import build_backend
from tt_serve.model.tt.runtime.weight_cache import default_cache_dir

if TYPE_CHECKING:
    from tt_serve.config import ServeConfig


def open_backend(
    path: str | Path,
    options: TTOptions,
    spec: ModelSpec,
    *,
    target: Target | None = None,
    ops: Ops | None = None,
) -> TTBackend:
    """Open the device (``options.device_ids`` as ``target.mesh``) with an
    ``options.trace_region_size``-byte trace region and build the backend for a checkpoint
    folder (converted weights cached under ``default_cache_dir()``); ``target`` is worked out
    from the options (no board: one CCL link per axis) unless given, ``ops`` is the real ttnn
    unless given."""
    from tt_serve.model.weights import load_weights

    ids = options.device_ids
    shape = target.mesh if target else options.mesh or (1, len(ids))
    if shape[0] * shape[1] != len(ids):
        raise ValueError(
            f"mesh {shape[0]} x {shape[1]} needs {shape[0] * shape[1]} device ids; got {ids}"
        )
    # A split that does not divide fails here, before the device opens.
    place = target or Target.of(spec, None, options)
    ops = ops or Ops.load()
    region = options.trace_region_size
    if shape == (1, 1):
        ops.open_device(ids[0], trace_region_size=region, l1_small_size=DEFAULT_L1_SMALL)
    else:
        ops.open_mesh(
            shape, trace_region_size=region, l1_small_size=DEFAULT_L1_SMALL, device_ids=ids
        )
    return build_backend(
        spec,
        lambda: to_numpy(load_weights(path, spec)),
        ops=ops,
        options=options,
        tp=place.tp,
        ccl_links=place.links,
        weight_cache_dir=default_cache_dir(),
        checkpoint=Path(path),
    )


def identify(ops: Ops) -> DeviceSpec:
    """The box the chips belong to, by the ClusterType ttnn reports before any device opens:
    the one way a start knows its hardware (ValueError when no description has it)."""
    return board_for_cluster(ops.cluster_type())


def launch(
    cfg: ServeConfig, spec: ModelSpec, *, max_model_len: int, ops: Ops | None = None
) -> Launched:
    """The backend ``cfg`` describes, started once: a ``trace_region_size`` or ``kv_blocks`` of
    0 is planned (one planner call, on the virtual device of the identified box, before the
    device opens); both given, nothing is planned and an unknown box still starts (one CCL link
    per axis on a mesh)."""
    if cfg.model is None:
        raise ValueError("the ttnn backend needs cfg.model (a checkpoint folder)")
    options = TTOptions.from_config(cfg, max_model_len=max_model_len)
    ops = ops or Ops.load()
    needs_plan = options.trace_region_size == 0 or options.kv_blocks == 0
    try:
        board: DeviceSpec | None = identify(ops)
    except ValueError:
        if needs_plan:
            raise
        board = None
    place = Target.of(spec, board, options)
    if needs_plan:
        from tt_serve.model.tt.plan.planner import plan_pools

        pools = plan_pools(spec, place, options)
        options = options.replace(
            trace_region_size=pools.trace_region_size, kv_blocks=pools.num_kv_blocks
        )
    backend = open_backend(cfg.model, options, spec, ops=ops, target=place)
    return Launched(backend, options.kv_blocks)
