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
    ("ttnn-batch-32", {**TTNN, "maxBatchSize": 32}, True),
    ("ttnn-batch-33", {**TTNN, "maxBatchSize": 33}, False),
    ("ttnn-batch-0", {**TTNN, "maxBatchSize": 0}, False),
    ("torch-batch-64", {"maxBatchSize": 64}, True),
    ("torch-batch-0", {"maxBatchSize": 0}, False),
    ("prefix-stride-not-gdn-multiple", {"prefillChunk": 96, "blockSize": 32}, False),
    (
        "no-prefix-stride-96",
        {"prefillChunk": 96, "blockSize": 32, "prefixCaching": {"enable": False}},
        True,
    ),
    ("prefix-stride-not-block-multiple", {"prefillChunk": 192, "blockSize": 128}, False),
    ("prefix-zero-slots", {"prefixCaching": {"snapshotSlots": 0}}, False),
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
    ("traced-ttnn", {**TTNN, "tracedPrefill": True, "prefillChunk": 2048}, True),
    ("traced-on-cpu", {"tracedPrefill": True}, False),
    ("ttnn-block-48", {**TTNN, "blockSize": 48, "prefixCaching": {"enable": False}}, False),
    ("ttnn-duplicate-ids", {**TTNN, "deviceIds": [0, 0]}, False),
    ("ttnn-no-ids", {**TTNN, "deviceIds": []}, False),
    ("ttnn-four-ids", {**TTNN, "deviceIds": [0, 1, 2, 3]}, True),
    ("token-budget-below-chunk", {"maxNumBatchedTokens": 128}, False),
    ("port-0", {"port": 0}, False),
    ("block-0", {"blockSize": 0}, False),
    (
        "many-wrong",
        {
            "device": "tpu",
            "dtype": "fp8",
            "logLevel": "loud",
            "kvBlocks": -1,
            "maxWaiting": -1,
            "backend": "cuda",
            "prefixCaching": {"snapshotSlots": -1},
        },
        False,
    ),
]


def nix_verdicts(cases: list[dict[str, Any]]) -> list[list[str]]:
    expr = """{ cases }:
      let
        d = import ./modules/lib/defaults.nix;
        inv = import ./modules/lib/invariants.nix;
        withDefaults = c: d // c // { prefixCaching = d.prefixCaching // (c.prefixCaching or { }); };
      in map (c: map (a: a.message) (builtins.filter (a: !a.assertion) (inv (withDefaults c))))
        (builtins.fromJSON cases)"""
    out: list[list[str]] = nix_eval_json(expr, cases=json.dumps(cases))
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
