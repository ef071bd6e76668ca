"""A ttnn start, once and in one direction (as vLLM's ``EngineCore._initialize_kv_caches`` and
nano-vllm's ``ModelRunner.__init__`` start theirs):

    identify the box (its ClusterType, asked before anything opens)
    -> plan the trace region and the KV pool on the virtual device of that box, once
    -> open the device or mesh with that trace region
    -> build: tensor parallel once -> layout -> upload (cached) -> model -> backend
    -> hand the engine factory the backend and the pool size it allocates.

Only this module and the planner know the virtual device; the runtime never imports either.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from tt_serve.model.interface import Launched
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import DeviceSpec, board_for_cluster
from tt_serve.model.tt.layout.host import to_numpy
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.ops import DEFAULT_L1_SMALL, Ops
from tt_serve.model.tt.precision import Precision
from tt_serve.model.tt.runtime.backend import TTBackend
from tt_serve.model.tt.runtime.build import DEFAULT_CCL_LINKS, TTOptions, build_backend
from tt_serve.model.tt.runtime.weight_cache import default_cache_dir

if TYPE_CHECKING:
    from tt_serve.config import ServeConfig


def open_backend(
    path: str | Path,
    *,
    trace_region_size: int,
    spec: ModelSpec | None = None,
    device_ids: tuple[int, ...] = (0,),
    mesh: tuple[int, int] | None = None,
    ops: Ops | None = None,
    **options: Unpack[TTOptions],
) -> TTBackend:
    """Open the device with a ``trace_region_size``-byte trace region and build the backend
    for a checkpoint folder (converted weights cached under ``default_cache_dir()`` unless
    ``weight_cache_dir`` is given); ``spec`` is read from its config.json unless the caller has
    it, ``ops`` is the real ttnn unless given. ``mesh`` (rows, cols): a MeshDevice over
    ``device_ids`` (None: one device, or (1, len(device_ids))), in row-major order of the ids."""
    from tt_serve.model.weights import load_weights

    model_spec = spec or ModelSpec.from_hf_dir(path)
    shape = mesh or (1, len(device_ids))
    if shape[0] * shape[1] != len(device_ids):
        raise ValueError(
            f"mesh {shape[0]} x {shape[1]} needs {shape[0] * shape[1]} device ids; got {device_ids}"
        )
    if shape != (1, 1):
        TensorParallel.for_mesh(model_spec, shape)  # a split that does not divide: before open
    ops = ops or Ops.load()
    if shape == (1, 1):
        ops.open_device(
            device_ids[0], trace_region_size=trace_region_size, l1_small_size=DEFAULT_L1_SMALL
        )
    else:
        ops.open_mesh(
            shape,
            trace_region_size=trace_region_size,
            l1_small_size=DEFAULT_L1_SMALL,
            device_ids=device_ids,
        )
    options["weight_cache_dir"] = options.get("weight_cache_dir") or default_cache_dir()
    options["checkpoint"] = Path(path)
    return build_backend(
        model_spec, lambda: to_numpy(load_weights(path, model_spec)), ops=ops, **options
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
    from tt_serve.config import mesh_shape

    mesh = mesh_shape(cfg)  # config.py owns "ROWSxCOLS" / 1 x len(device_ids)
    ops = ops or Ops.load()
    region, blocks = cfg.trace_region_size, cfg.kv_blocks
    needs_plan = region == 0 or blocks == 0
    try:
        board: DeviceSpec | None = identify(ops)
    except ValueError:
        if needs_plan:
            raise
        board = None
    # The links tt_transformers' get_num_links gives the box (2 on P150x4 / P300, 4 and 3 on a
    # Galaxy's axes).
    links = board.links_on(mesh) if board is not None and mesh != (1, 1) else DEFAULT_CCL_LINKS
    if needs_plan:
        from tt_serve.model.tt.plan.planner import plan_pools

        assert board is not None
        plan_cfg = dataclasses.replace(cfg, max_model_len=max_model_len)
        pools = plan_pools(plan_cfg, spec, board.name)
        region, blocks = pools.trace_region_size, pools.num_kv_blocks
    backend = open_backend(
        cfg.model,
        trace_region_size=region,
        ops=ops,
        spec=spec,
        device_ids=cfg.device_ids,
        mesh=mesh,
        precision=Precision.named(cfg.resolved_precision),
        traced_prefill=cfg.traced_prefill,
        device_resident=cfg.device_resident,
        max_prefill_chunk=cfg.prefill_chunk,
        max_model_len=max_model_len,
        ccl_links=links,
    )
    return Launched(backend, blocks)
