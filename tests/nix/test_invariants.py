"""One rule set, two enforcers: modules/lib/invariants.nix (run by the real Nix evaluator, no
nixpkgs needed) and tt_serve.config.validate() must give identical verdicts and messages."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.nix.nixtools import nix_eval_json
from tt_serve.config import ServeConfig, config_from_json_dict, validate

P = "services.tenstorrent-serving"
TTNN = {"backend": "ttnn"}

# (name, settings in NixOS option names, accepted?)
TRUTH_TABLE: list[tuple[str, dict[str, Any], bool]] = [
    ("defaults", {}, True),
    (
        "resident-without-argmax-ttnn",
        {**TTNN, "deviceResident": True, "deviceArgmax": False},
        False,
    ),
    ("resident-without-argmax-cpu", {"deviceResident": True, "deviceArgmax": False}, False),
    ("resident-with-argmax-ttnn", {**TTNN, "deviceResident": True}, True),
    ("resident-on-cpu", {"deviceResident": True}, False),
    ("resident-on-cuda", {"deviceResident": True, "device": "cuda:1"}, True),
    ("mesh-1x1", {**TTNN, "mesh": "1x1"}, True),
    ("mesh-malformed", {**TTNN, "mesh": "4"}, False),
    ("mesh-zero-rows", {**TTNN, "mesh": "0x4", "deviceIds": [0, 1, 2, 3]}, False),
    ("mesh-on-torch", {"mesh": "1x1"}, False),
    ("mesh-size-mismatch", {**TTNN, "mesh": "1x2"}, False),
    ("mesh-1x4", {**TTNN, "mesh": "1x4", "deviceIds": [0, 1, 2, 3]}, True),
    ("mesh-default-four-ids", {**TTNN, "deviceIds": [0, 1, 2, 3]}, True),
    ("mesh-2d", {**TTNN, "mesh": "2x4", "deviceIds": list(range(8))}, True),
    ("mesh-galaxy-8x4", {**TTNN, "mesh": "8x4", "deviceIds": list(range(32))}, True),
    ("mesh-bh-galaxy-4x8", {**TTNN, "mesh": "4x8", "deviceIds": list(range(32))}, True),
    ("mesh-2x2", {**TTNN, "mesh": "2x2", "deviceIds": list(range(4))}, True),
    ("mesh-side-3", {**TTNN, "mesh": "2x3", "deviceIds": list(range(6))}, False),
    ("mesh-side-16", {**TTNN, "mesh": "1x16", "deviceIds": list(range(16))}, False),
    ("mesh-one-column", {**TTNN, "mesh": "4x1", "deviceIds": list(range(4))}, False),
    ("mesh-2d-size-mismatch", {**TTNN, "mesh": "2x4", "deviceIds": list(range(4))}, False),
    ("ttnn-batch-32", {**TTNN, "maxBatchSize": 32}, True),
    ("ttnn-batch-33", {**TTNN, "maxBatchSize": 33}, False),
    ("ttnn-batch-0", {**TTNN, "maxBatchSize": 0}, True),
    ("ttnn-batch-negative", {**TTNN, "maxBatchSize": -1}, False),
    ("torch-batch-64", {"maxBatchSize": 64}, True),
    ("cuda-batch-64", {"maxBatchSize": 64, "device": "cuda"}, True),
    ("cuda-auto-host-argmax", {"device": "cuda", "deviceArgmax": False}, True),
    (
        "cuda-explicit-off",
        {"device": "cuda", "deviceResident": False, "tracedPrefill": False},
        True,
    ),
    ("gpu-memory-half", {"device": "cuda", "gpuMemoryUtilization": 0.5}, True),
    ("prefill-rows-default", {"maxPrefillRows": 0}, True),
    ("prefill-rows-negative", {"maxPrefillRows": -1}, False),
    ("step-probe-off", {"stepProbeSeconds": 0}, True),
    ("step-probe-negative", {"stepProbeSeconds": -1.5}, False),
    ("gpu-memory-zero", {"device": "cuda", "gpuMemoryUtilization": 0.0}, False),
    ("gpu-memory-over-one", {"device": "cuda", "gpuMemoryUtilization": 1.5}, False),
    ("torch-batch-0", {"maxBatchSize": 0}, True),
    ("torch-batch-negative", {"maxBatchSize": -3}, False),
    ("prefix-stride-not-gdn-multiple", {"prefillChunk": 96, "blockSize": 32}, False),
    (
        "no-prefix-stride-96",
        {"prefillChunk": 96, "blockSize": 32, "prefixCaching": {"enable": False}},
        True,
    ),
    ("prefix-stride-not-block-multiple", {"prefillChunk": 192, "blockSize": 128}, False),
    ("prefix-zero-slots", {"prefixCaching": {"snapshotSlots": 0}}, False),
    ("resume-chunks", {"resumePoints": "chunks", "snapshotsPerConversation": 0}, True),
    ("resume-unknown", {"resumePoints": "turns"}, False),
    ("snapshot-cap-negative", {"snapshotsPerConversation": -1}, False),
    ("tiers-on", {"hostCacheGb": 0.5, "diskCacheDir": "/var/cache/tt", "diskCacheGb": 8}, True),
    ("host-tier-negative", {"hostCacheGb": -1}, False),
    ("disk-tier-size-0", {"diskCacheDir": "/var/cache/tt", "diskCacheGb": 0}, False),
    ("disk-size-0-no-dir", {"diskCacheGb": 0}, True),
    (
        "disk-writeback-all",
        {"diskWriteback": "all", "diskWriteMbPerS": 0, "diskReadAheadMb": 0},
        True,
    ),
    ("disk-writeback-unknown", {"diskWriteback": "lazy"}, False),
    ("disk-read-ahead-negative", {"diskReadAheadMb": -1}, False),
    ("no-prefix-zero-slots", {"prefixCaching": {"enable": False, "snapshotSlots": 0}}, True),
    (
        "traced-chunk-not-block-multiple",
        {
            **TTNN,
            "tracedPrefill": True,
            "prefillChunk": 96,
            "blockSize": 64,
            "prefixCaching": {"enable": False},
        },
        False,
    ),
    (
        "chunk-not-block-multiple-untraced",
        {"prefillChunk": 96, "blockSize": 64, "prefixCaching": {"enable": False}},
        False,
    ),
    ("traced-ttnn", {**TTNN, "tracedPrefill": True, "prefillChunk": 2048}, True),
    ("traced-on-cpu", {"tracedPrefill": True}, False),
    ("ttnn-block-48", {**TTNN, "blockSize": 48, "prefixCaching": {"enable": False}}, False),
    ("ttnn-duplicate-ids", {**TTNN, "deviceIds": [0, 0]}, False),
    ("ttnn-no-ids", {**TTNN, "deviceIds": []}, False),
    ("ttnn-one-id", {**TTNN, "deviceIds": [3]}, True),
    ("token-budget-below-chunk", {"maxNumBatchedTokens": 128}, False),
    ("ttnn-float32", {**TTNN, "dtype": "float32"}, False),
    ("ttnn-bfloat16", {**TTNN, "dtype": "bfloat16"}, True),
    ("torch-float32", {"dtype": "float32"}, True),
    ("ttnn-precision-mixed", {**TTNN, "precision": "mixed"}, True),
    ("ttnn-precision-bfloat16", {**TTNN, "precision": "bfloat16", "dtype": "bfloat16"}, True),
    ("ttnn-precision-unknown", {**TTNN, "precision": "fp8"}, False),
    ("torch-precision-mixed", {"precision": "mixed"}, True),
    ("cpu-precision-mixed-bf16", {"precision": "mixed", "dtype": "bfloat16"}, False),
    ("cuda-precision-bfloat16", {"precision": "bfloat16", "device": "cuda"}, False),
    ("torch-precision-auto", {"precision": "auto", "device": "cuda"}, True),
    ("kv-blocks-1", {"kvBlocks": 1}, False),
    ("kv-blocks-2", {"kvBlocks": 2}, True),
    ("kv-blocks-4096", {"kvBlocks": 4096}, True),
    ("kv-blocks-negative", {"kvBlocks": -1}, False),
    ("max-model-len-negative", {"maxModelLen": -1}, False),
    ("max-model-len-32k", {"maxModelLen": 32768}, True),
    ("trace-region-negative", {**TTNN, "traceRegionSize": -1}, False),
    ("trace-region-768m", {**TTNN, "traceRegionSize": 805306368}, True),
    ("port-0", {"port": 0}, False),
    ("block-0", {"blockSize": 0}, False),
    ("chunk-0", {"prefillChunk": 0}, False),
    ("response-store-negative", {"responseStoreEntries": -1}, False),
    ("response-store-off", {"responseStoreEntries": 0, "responseStoreMb": 0}, True),
    ("drain-0", {"drainTimeout": 0}, False),
    ("drain-1", {"drainTimeout": 1}, True),
    ("router-policy-unknown", {"routerPolicy": "sticky"}, False),
    ("router-round-robin", {"routerPolicy": "round_robin", "instances": [[0], [1]]}, True),
    ("four-cpu-replicas", {"instances": [[0], [1], [2], [3]]}, True),
    ("replica-empty-group", {"instances": [[0], []]}, False),
    ("replica-negative-id", {"instances": [[-1]]}, False),
    ("replica-device-twice", {"instances": [[0], [1, 0]]}, False),
    ("ttnn-four-replicas", {**TTNN, "instances": [[0], [1], [2], [3]]}, True),
    ("ttnn-replica-group-of-two", {**TTNN, "instances": [[0, 1], [2]]}, True),
    (
        "ttnn-replica-meshes",
        {**TTNN, "mesh": "1x2", "deviceIds": [0, 1], "instances": [[0, 1], [2, 3]]},
        True,
    ),
    (
        "ttnn-replica-not-a-mesh",
        {**TTNN, "mesh": "1x2", "deviceIds": [0, 1], "instances": [[0, 1], [2]]},
        False,
    ),
    ("cuda-replica-group-of-two", {"device": "cuda", "instances": [[0, 1]]}, False),
    ("cpu-replica-group-of-two", {"instances": [[0, 1], [2]]}, True),
    ("replica-ports-overflow", {"instances": [[0], [1]], "workerBasePort": 65535}, False),
    ("replica-port-0", {"instances": [[0]], "workerBasePort": 0}, False),
    ("router-port-on-a-worker", {"instances": [[0], [1]], "port": 8101}, False),
    ("prometheus-on-router-port", {"instances": [[0]], "routerPrometheusPort": 8000}, False),
    ("prometheus-on-a-worker", {"instances": [[0], [1]], "routerPrometheusPort": 8100}, False),
    ("prometheus-port-0", {"instances": [[0]], "routerPrometheusPort": 0}, False),
    ("one-server-on-a-worker-port", {"port": 8100, "routerPrometheusPort": 8100}, True),
    (
        "many-wrong-replicas",
        {
            **TTNN,
            "mesh": "1x2",
            "deviceIds": [0, 1],
            "drainTimeout": -1,
            "routerPolicy": "sticky",
            "instances": [[0, 1], [1], []],
            "workerBasePort": 65534,
            "port": 65535,
            "routerPrometheusPort": 65534,
        },
        False,
    ),
    (
        "many-wrong",
        {
            "device": "tpu",
            "dtype": "fp8",
            "logLevel": "loud",
            "kvBlocks": -1,
            "maxWaiting": -1,
            "backend": "cuda",
            "precision": "fp8",
            "maxModelLen": -1,
            "prefixCaching": {"snapshotSlots": -1},
        },
        False,
    ),
    (
        "many-wrong-ttnn",
        {
            **TTNN,
            "dtype": "float32",
            "precision": "fp4",
            "tracedPrefill": True,
            "prefillChunk": 96,
            "blockSize": 64,
            "kvBlocks": 1,
            "maxBatchSize": 64,
            "maxModelLen": -5,
            "traceRegionSize": -1,
            "prefixCaching": {"enable": False},
        },
        False,
    ),
]


def nix_rules(cases: list[dict[str, Any]], per_case: str) -> Any:
    """`per_case` (assertions -> value) applied to invariants.nix for each case, defaults filled."""
    expr = f"""{{ cases }}:
      let
        d = import ./modules/lib/defaults.nix;
        inv = import ./modules/lib/invariants.nix;
        pcOf = c: d.prefixCaching // (c.prefixCaching or {{ }});
        withDefaults = c: d // c // {{ prefixCaching = pcOf c; }};
      in map (c: ({per_case}) (inv (withDefaults c))) (builtins.fromJSON cases)"""
    return nix_eval_json(expr, cases=json.dumps(cases))


def nix_verdicts(cases: list[dict[str, Any]]) -> list[list[str]]:
    """The messages of the failed assertions, in rule order, for each case."""
    out: list[list[str]] = nix_rules(
        cases, "as: map (a: a.message) (builtins.filter (a: !a.assertion) as)"
    )
    return out


@pytest.fixture(scope="module")
def verdicts() -> list[list[str]]:
    return nix_verdicts([settings for _, settings, _ in TRUTH_TABLE])


@pytest.mark.parametrize(
    ("index", "case"), list(enumerate(TRUTH_TABLE)), ids=[c[0] for c in TRUTH_TABLE]
)
def test_nix_and_python_agree(
    verdicts: list[list[str]], index: int, case: tuple[str, dict[str, Any], bool]
) -> None:
    _, settings, accepted = case
    python = validate(config_from_json_dict(settings))
    assert python == verdicts[index]
    assert (python == []) is accepted, python


def test_every_rule_fails_and_holds_somewhere() -> None:
    """Each rule in invariants.nix is violated by some truth-table case and holds in another."""
    cases = [settings for _, settings, _ in TRUTH_TABLE]
    held: list[list[bool]] = nix_rules(cases, "map (a: a.assertion)")
    names = [name for name, *_ in TRUTH_TABLE]
    for rule in range(len(held[0])):
        failing = [names[i] for i, row in enumerate(held) if not row[rule]]
        assert failing, f"rule {rule} of invariants.nix fails in no truth-table case"
        assert len(failing) < len(held), f"rule {rule} fails in every case"


def test_rule_order_on_one_ttnn_config(verdicts: list[list[str]]) -> None:
    messages = verdicts[[name for name, *_ in TRUTH_TABLE].index("many-wrong-ttnn")]
    heads = [m.split(" ")[0].removeprefix(P + ".") for m in messages]
    assert heads == [
        "dtype", "precision", "prefillChunk", "maxBatchSize", "kvBlocks", "maxModelLen",
        "traceRegionSize",
    ]  # fmt: skip


def test_replica_rule_order() -> None:
    index = [name for name, *_ in TRUTH_TABLE].index("many-wrong-replicas")
    messages = nix_verdicts([TRUTH_TABLE[index][1]])[0]
    heads = [m.split(" ")[0].removeprefix(P + ".") for m in messages]
    assert heads == [
        "drainTimeout", "routerPolicy", "instances", "instances", "instances",
        "workerBasePort", "port", "routerPrometheusPort",
    ]  # fmt: skip


NEW_RULE_MESSAGES = {
    "replica-device-twice": [f'{P}.instances must not use a device twice (got "0;1,0").'],
    "ttnn-replica-not-a-mesh": [
        f'{P}.instances must give each worker one device per chip of {P}.mesh = "1x2" (2) on '
        'backend ttnn (got "0,1;2").'
    ],
    "cuda-replica-group-of-two": [
        f"{P}.instances must give each worker one device on a CUDA {P}.device "
        '(got backend torch, device cuda; got "0,1").'
    ],
    "mesh-2d": [],
    "mesh-side-3": [
        f'{P}.mesh = "2x3": each side must be 1, 2, 4 or 8 (the shapes tt-metal opens: 1x2, '
        "1x4, 1x8, 2x4, 8x4, 4x8; heads and tile widths split by powers of two)."
    ],
    "mesh-one-column": [
        f'{P}.mesh = "4x1" puts the chips in one column; tensor parallel splits the heads over '
        'the columns: use "1x4".'
    ],
    "mesh-2d-size-mismatch": [
        f'{P}.mesh = "2x4" has 8 chips but {P}.deviceIds names 4 ("0,1,2,3"): give one device '
        "id per chip."
    ],
    "mesh-size-mismatch": [
        f'{P}.mesh = "1x2" has 2 chips but {P}.deviceIds names 1 ("0"): give one device id '
        "per chip."
    ],
    "router-port-on-a-worker": [
        f"{P}.port (8101) is the router's and must not be one of the workers' ports 8100..8101."
    ],
    "replica-ports-overflow": [
        f"{P}.workerBasePort (65535) leaves no room for 2 workers: ports 65535..65536 must be "
        "in 1..65535."
    ],
    "prometheus-on-a-worker": [
        f"{P}.routerPrometheusPort (8100) must be in 1..65535 and differ from {P}.port and the "
        "workers' ports 8100..8101."
    ],
    "drain-0": [f"{P}.drainTimeout must be at least 1 second (got 0)."],
    "disk-writeback-unknown": [f"{P}.diskWriteback must be one of resume, all (got lazy)."],
    "disk-read-ahead-negative": [
        f"{P}.diskWriteMbPerS and {P}.diskReadAheadMb must not be negative (0: unpaced; 0: reads "
        "in the step; got 256 and -1)."
    ],
    "response-store-negative": [
        f"{P}.responseStoreEntries and {P}.responseStoreMb must not be negative (got -1 and 256)."
    ],
    "prefill-rows-negative": [
        f"{P}.maxPrefillRows must not be negative (0 = the backend's default; got -1)."
    ],
    "step-probe-negative": [
        f"{P}.stepProbeSeconds must not be negative (0: no startup probe; got -1.500000)."
    ],
    "gpu-memory-zero": [
        f"{P}.gpuMemoryUtilization must be more than 0 and at most 1 (a fraction of the GPU's "
        "memory)."
    ],
    "ttnn-float32": [
        f"{P}.dtype = float32 is not available on backend ttnn (it computes in bfloat16 and "
        f"block floats): use auto or bfloat16, and {P}.precision for the weights."
    ],
    "ttnn-precision-unknown": [
        f"{P}.precision must be one of auto, bfloat16, mixed, bfp4-mlp (got fp8)."
    ],
    "cpu-precision-mixed-bf16": [
        f"{P}.precision = mixed on backend torch holds the card's weight formats for the CPU's "
        f"float32 kernels: it needs a CPU {P}.device and {P}.dtype auto or float32 (got device "
        "cpu, dtype bfloat16)."
    ],
    "chunk-not-block-multiple-untraced": [
        f"{P}.prefillChunk (96) must be a multiple of {P}.blockSize (64): prefill chunks end on "
        "block boundaries."
    ],
    "kv-blocks-1": [
        f"{P}.kvBlocks must be 0 (size from memory) or at least 2 (block 0 is reserved for "
        "padding; got 1)."
    ],
    "max-model-len-negative": [
        f"{P}.maxModelLen must not be negative (0 = the model's own; got -1)."
    ],
    "trace-region-negative": [
        f"{P}.traceRegionSize must not be negative (0 = sized from the captured traces; got -1)."
    ],
}


@pytest.mark.parametrize("name", sorted(NEW_RULE_MESSAGES))
def test_new_rule_messages_verbatim(verdicts: list[list[str]], name: str) -> None:
    assert verdicts[[n for n, *_ in TRUTH_TABLE].index(name)] == NEW_RULE_MESSAGES[name]


def test_truth_table_is_big_enough() -> None:
    assert len(TRUTH_TABLE) >= 10
    assert sum(ok for *_, ok in TRUTH_TABLE) >= 3
    assert sum(not ok for *_, ok in TRUTH_TABLE) >= 3


def test_resident_without_argmax_names_both_options(verdicts: list[list[str]]) -> None:
    index = [name for name, *_ in TRUTH_TABLE].index("resident-without-argmax-ttnn")
    messages = verdicts[index]
    assert len(messages) == 1
    assert f"{P}.deviceResident = true" in messages[0]
    assert f"{P}.deviceArgmax = true" in messages[0]


def test_python_defaults_equal_defaults_nix() -> None:
    nix_defaults = nix_eval_json("import ./modules/lib/defaults.nix")
    assert ServeConfig().to_json_dict() == nix_defaults


def test_gdn_chunk_is_the_same_constant() -> None:
    # 128 is a multiple of block 32 and of 64 (GDN); 160 is a multiple of 32 but not of 64.
    ok, bad = nix_verdicts(
        [{"prefillChunk": 128, "blockSize": 32}, {"prefillChunk": 160, "blockSize": 32}]
    )
    assert ok == []
    assert len(bad) == 1 and "GDN chunk (64)" in bad[0]
