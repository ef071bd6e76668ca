"""CONTRACT FAKE of the ttnn surface that ``tt_serve/model/tt/ops/`` uses. Not a simulator.

It computes each op's documented semantics with torch in float32 (so the tt backend can be
compared token for token with the torch reference; device numerics are tested only in
``tests/tt_hardware``) and enforces the ttnn rules the backend must respect, raising
``ContractViolation`` when one is broken:

* tile: TILE tensors pad to 32; paged caches, chunk lengths and conv widths must be tile-aligned;
* dtype: op inputs have the documented dtypes/layouts (uint32 ids, int32 page tables and
  positions, cache dtype == fill input dtype, bfloat8_b only in TILE, ...); argmax returns
  UINT32 ROW_MAJOR; copies need equal shape, dtype and layout;
* host_io: no host read or write while a trace is being captured;
* alloc: no device buffer allocated after a trace's capture may be alive when it replays;
* identity: a trace's inputs must still be alive (same buffers) at replay;
* one_trace: capturing a program identical to a live trace (same ops and shapes) is refused;
* runtime_args: under capture, the chunk start and cache positions must be device tensors, and
  chunk_gated_delta_rule must get its constant tiles explicitly;
* program_cache: every program captured must have run eagerly before (compile run);
* device limits (``tt_serve/model/tt/virtual/rules_*.py``, rule names ``<op>.<check>``): every
  op call is checked against tt-metal's own validation for the virtual chip (default a Blackhole P150,
  ``VirtualTTNN(chip=WORMHOLE)`` for an 8x8 Wormhole): core-grid limits, shape, dtype, layout and
  sharding rules; every device allocation is charged to the chip's DRAM banks
  (``dram.capacity``); every capture is charged to the trace region at ``end_trace_capture``
  (``trace.region``, an estimate of the command stream) and released by ``release_trace``.
  Paged SDPA decode calls are recorded in ``sdpa_decode_plans`` (whether a program config was
  given, cores per head, exp_approx_mode); ``require_sdpa_program_config=True`` makes a missing
  config an error;
* async_read: the host tensor of ``from_device(blocking=False)`` is unreadable (to_numpy,
  to_layout, upload) until ``event_synchronize`` of an event recorded after the read, or
  ``synchronize_device``. The fake copies the value when the read is enqueued, as the in-order
  device would read it then, whatever later replays write into the source buffer.

``VirtualTTNN(card_formats=True)``: every value a tensor stores is rounded to its dtype as the
card stores it (bf16 round to nearest even; bfloat8_b / bfloat4_b as tt-metal's block-float
packer, ``tt_serve/model/formats.py``), so a run carries the card's storage error; ops still
compute in float32 (math fidelity and bf16 accumulation are not modelled). Off by default.

Replay re-runs the recorded ops on the recorded buffers, in place, like a device trace.

``VirtualTTNN(shape_only=True)`` (the planner's device model, ``plan/planner.py``): tensors hold torch
``meta`` data (shape, dtype, layout and placement, no storage); ops run every rule above and
produce outputs of the right shape without computing; host reads return zeros; replays check
their rules and recompute nothing. Real-size models (Qwen3.5-9B) run in seconds.
"""

from __future__ import annotations

from types import SimpleNamespace

from tt_serve.model.tt.boards import DEVICES, ChipSpec, device_spec
from tt_serve.model.tt.virtual.attention import AttentionOps
from tt_serve.model.tt.virtual.base import DeviceBase
from tt_serve.model.tt.virtual.eltwise import EltwiseOps
from tt_serve.model.tt.virtual.gdn import GdnOps
from tt_serve.model.tt.virtual.host import HostOps
from tt_serve.model.tt.virtual.matmul import MatmulOps
from tt_serve.model.tt.virtual.moe import MoeOps
from tt_serve.model.tt.virtual.movement import MovementOps
from tt_serve.model.tt.virtual.traces import TraceOps

WORMHOLE = device_spec("n150").chip  # 8x8 workers, 12 x 1 GiB DRAM banks
P150 = device_spec("p150").chip  # 11x10 workers, 8 x (4 GiB - 16 MiB) DRAM banks


def cluster_type_of(chip: ChipSpec, num_devices: int) -> str:
    """The ClusterType name a box of ``num_devices`` ``chip``s reports (the first description
    that matches), or ``"CUSTOM"``."""
    for d in DEVICES.values():
        if d.chip == chip and d.num_chips == num_devices and d.cluster_types:
            return d.cluster_types[0]
    return "CUSTOM"


def _cluster(name: str) -> SimpleNamespace:
    """``ttnn.cluster``: ``get_cluster_type()`` returns a ClusterType-like value (``.name``)."""
    value = SimpleNamespace(name=name)
    return SimpleNamespace(get_cluster_type=lambda: value)


class VirtualTTNN(
    TraceOps,
    HostOps,
    MovementOps,
    EltwiseOps,
    MatmulOps,
    AttentionOps,
    GdnOps,
    MoeOps,
    DeviceBase,
):
    """The module-like fake: attribute names as in ttnn 0.81.1. Each op family is a mixin over
    ``DeviceBase``'s bookkeeping; this class adds ttnn's namespaces (``experimental``,
    ``transformer``) and ``ttnn.Tensor``."""

    def __init__(
        self,
        *,
        num_devices: int = 1,
        chip: ChipSpec = P150,
        require_sdpa_program_config: bool = False,
        shape_only: bool = False,
        cluster_type: str | None = None,
        card_formats: bool = False,
    ) -> None:
        super().__init__(
            num_devices=num_devices,
            chip=chip,
            require_sdpa_program_config=require_sdpa_program_config,
            shape_only=shape_only,
            card_formats=card_formats,
        )
        # ``ttnn.cluster.get_cluster_type()``: given, or the box of ``num_devices`` such chips
        self.cluster = _cluster(cluster_type or cluster_type_of(chip, num_devices))
        self.Tensor = self._host_tensor
        self.experimental = SimpleNamespace(
            paged_fill_cache=self._paged_fill_cache,
            paged_update_cache=self._paged_update_cache,
            nlp_create_qkv_heads=self._create_qkv_heads,
            kda=SimpleNamespace(qkv_causal_conv1d_silu=self._qkv_conv),
        )
        self.transformer = SimpleNamespace(
            chunked_scaled_dot_product_attention=self._chunked_sdpa,
            paged_scaled_dot_product_attention_decode=self._sdpa_decode,
            chunk_gated_delta_rule=self._chunk_gdr,
            fused_recurrent_gated_delta_rule=self._recurrent_gdr,
        )
