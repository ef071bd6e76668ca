"""tt_serve.config: serve flags, ServeConfig, check-config JSON, validate(), dry run.

The cross-check against the Nix rules lives in tests/nix/test_invariants.py."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from tt_serve.config import (
    GDN_CHUNK,
    PRECISIONS,
    ConfigError,
    ServeConfig,
    add_serve_arguments,
    check_config_main,
    config_from_json_dict,
    dry_run,
    load_config_json,
    serve_flag_fields,
    validate,
)

P = "services.tenstorrent-serving"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tt-serve serve")
    add_serve_arguments(parser)
    return parser.parse_args(list(argv))


def test_parser_defaults_are_the_dataclass_defaults() -> None:
    ns = parse()
    assert ServeConfig.from_args(ns) == ServeConfig()
    assert ns.dry_run is False
    assert GDN_CHUNK == 64


def test_flags_map_to_fields() -> None:
    ns = parse(
        "--backend", "ttnn", "--device-ids", "0,2", "--no-device-argmax", "--device-resident",
        "--no-prefix-caching", "--snapshot-slots", "0", "--prefill-chunk", "512",
        "--api-key-file", "/k", "--log-level", "debug", "--dry-run",
    )  # fmt: skip
    cfg = ServeConfig.from_args(ns)
    assert cfg.backend == "ttnn" and cfg.device_ids == (0, 2)
    assert cfg.device_argmax is False and cfg.device_resident is True
    assert cfg.prefix_caching is False and cfg.snapshot_slots == 0
    assert cfg.prefill_chunk == 512 and cfg.api_key_file == "/k" and ns.dry_run is True


def test_new_flags_map_to_fields() -> None:
    cfg = ServeConfig.from_args(parse("--precision", "mixed", "--max-model-len", "4096"))
    assert cfg.precision == "mixed" and cfg.max_model_len == 4096
    assert ServeConfig.from_args(parse()).precision == "auto"
    assert ServeConfig.from_args(parse()).max_model_len == 0


def test_bad_device_ids_are_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        parse("--device-ids", "0,x")


@pytest.mark.parametrize("argv", [("--precision", "fp8"), ("--max-model-len", "4k")])
def test_bad_new_flags_are_usage_errors(argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)


def serve_help_entries(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """`tt-serve serve --help` (the parser serve_main builds) as flag -> its help entry text."""
    monkeypatch.setenv("COLUMNS", "80")
    parser = argparse.ArgumentParser(
        prog="tt-serve serve", description="OpenAI-compatible HTTP server."
    )
    add_serve_arguments(parser)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        parser.parse_args(["--help"])
    assert info.value.code == 0
    text = out.getvalue().split("\noptions:\n", 1)[1]
    entries: dict[str, str] = {}
    for block in re.split(r"\n(?=  -)", text.strip("\n")):
        invocation, _, rest = block.strip().partition("  ")
        for flag in re.findall(r"--[a-z][a-z-]*", invocation):
            entries[flag] = " ".join(rest.split())
    return entries


def _squash(text: str) -> str:
    """Without whitespace: argparse re-wraps help lines (also after hyphens)."""
    return "".join(text.split())


def test_help_lists_every_field_with_help_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = serve_help_entries(monkeypatch)
    missing_default = []
    for field in serve_flag_fields():
        flag = "--" + field.name.replace("_", "-")
        assert flag in entries, f"{flag} is not in tt-serve serve --help"
        assert _squash(field.metadata["help"]) in _squash(entries[flag]), flag
        if "default" not in entries[flag]:
            missing_default.append(flag)
        if not isinstance(field.default, bool):
            default = field.default
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
            shown = "auto" if field.metadata.get("auto") and default is None else shown
            assert _squash(f"(default: {shown})") in _squash(entries[flag]), flag
    assert missing_default == [], f"--help shows no default for {missing_default}"
    assert "--dry-run" in entries


def test_graphs_and_residency_are_on_by_default_on_cuda_only() -> None:
    """auto (None) resolves per backend and device; explicit values always win; the dry run
    shows the resolved values."""
    cpu, cuda = ServeConfig(), ServeConfig(device="cuda:1")
    assert (cpu.device_resident, cpu.traced_prefill) == (None, None)
    assert (cpu.resolved_device_resident, cpu.resolved_traced_prefill) == (False, False)
    assert (cuda.resolved_device_resident, cuda.resolved_traced_prefill) == (True, True)
    ttnn = ServeConfig(backend="ttnn", device_ids=(0,))
    assert (ttnn.resolved_device_resident, ttnn.resolved_traced_prefill) == (False, False)
    off = ServeConfig(device="cuda", device_resident=False, traced_prefill=False)
    assert (off.resolved_device_resident, off.resolved_traced_prefill) == (False, False)
    # auto residency follows device argmax (it feeds the device's picks back); no violation
    host_argmax = ServeConfig(device="cuda", device_argmax=False)
    assert not host_argmax.resolved_device_resident and validate(host_argmax) == []
    assert validate(cpu) == [] and validate(cuda) == []
    # an explicit request where it cannot run is still refused
    assert any("deviceResident = true" in m for m in validate(ServeConfig(device_resident=True)))
    shown = cuda.to_json_dict(resolved=True)
    assert (shown["deviceResident"], shown["tracedPrefill"]) == (True, True)
    assert cuda.to_json_dict()["deviceResident"] is None


def test_resolved_dtype() -> None:
    assert ServeConfig().resolved_dtype == "float32"
    assert ServeConfig(device="cuda").resolved_dtype == "bfloat16"
    assert ServeConfig(backend="ttnn").resolved_dtype == "bfloat16"
    assert ServeConfig(dtype="float32", backend="ttnn").resolved_dtype == "float32"


def test_resolved_precision() -> None:
    assert PRECISIONS == ("auto", "bfloat16", "mixed", "bfp4-mlp")
    assert ServeConfig(backend="ttnn").resolved_precision == "bfloat16"
    assert ServeConfig(backend="ttnn", precision="mixed").resolved_precision == "mixed"
    assert ServeConfig().resolved_precision == "float32"  # torch: the checkpoint's weights
    assert ServeConfig(precision="bfp4-mlp").resolved_precision == "bfp4-mlp"


def test_from_kwargs() -> None:
    cfg = ServeConfig.from_kwargs("LLM", backend="ttnn", device_ids=[0, 1], precision="mixed")
    assert cfg == ServeConfig(backend="ttnn", device_ids=(0, 1), precision="mixed")
    with pytest.raises(TypeError, match=r"^LLM got unknown keyword\(s\): colour, max_len$"):
        ServeConfig.from_kwargs("LLM", max_len=4096, colour="red", port=1)


def test_json_round_trip() -> None:
    cfg = ServeConfig(
        backend="ttnn",
        device_ids=(1, 3),
        prefix_caching=False,
        snapshot_slots=4,
        precision="mixed",
        max_model_len=8192,
    )
    data = cfg.to_json_dict()
    assert data["prefixCaching"] == {"enable": False, "snapshotSlots": 4}
    assert data["deviceIds"] == [1, 3]
    assert data["precision"] == "mixed" and data["maxModelLen"] == 8192
    assert config_from_json_dict(json.loads(json.dumps(data))) == cfg


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"bogus": 1, "port": 1}, f"unknown option(s): {P}.bogus"),
        ({"prefixCaching": {"slots": 1}}, f"{P}.prefixCaching.slots"),
        ({"port": "8000"}, f"{P}.port must be int"),
        ({"port": True}, f"{P}.port must be int"),
        ({"deviceArgmax": 1}, f"{P}.deviceArgmax must be bool"),
        ({"deviceIds": [0, "1"]}, f"{P}.deviceIds must be int"),
        ({"maxModelLen": "4k"}, f"{P}.maxModelLen must be int"),
        ({"precision": None}, f"{P}.precision must be str"),
        ({"prefixCaching": True}, f"{P}.prefixCaching must be an object"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_bad_json_is_a_config_error(data: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        config_from_json_dict(data)
    assert needle in str(info.value)


def test_module_only_keys_are_accepted() -> None:
    data = {"enable": True, "openFirewall": True, "extraArgs": [], "hugepages": {"count": 2}}
    assert config_from_json_dict(data) == ServeConfig()


def test_max_batch_size_zero_is_the_backends_default() -> None:
    """0 (the default): 32 running requests on torch (CPU or CUDA), 16 on ttnn."""
    assert ServeConfig().max_batch_size == 0
    assert ServeConfig().resolved_max_batch_size == 32
    assert ServeConfig(device="cuda").resolved_max_batch_size == 32
    assert ServeConfig(backend="ttnn").resolved_max_batch_size == 16
    assert ServeConfig(backend="ttnn", max_batch_size=4).resolved_max_batch_size == 4
    assert validate(ServeConfig(max_batch_size=-1)) == [
        f"{P}.maxBatchSize must not be negative (0 = the backend's default; got -1)."
    ]


def test_validate_messages_name_nix_options() -> None:
    errors = validate(ServeConfig(device_resident=True, device_argmax=False, backend="ttnn"))
    assert errors == [
        f"{P}.deviceResident = true requires {P}.deviceArgmax = true "
        "(the decode loop feeds sampled ids back on the device; logits never leave it)."
    ]
    assert validate(ServeConfig(backend="ttnn", max_batch_size=33)) == [
        f"{P}.maxBatchSize must be in 0..32 on backend ttnn (0 = the backend's default; got 33)."
    ]


REFUSED = [
    (
        ServeConfig(backend="ttnn", max_batch_size=64),
        [f"{P}.maxBatchSize must be in 0..32 on backend ttnn (0 = the backend's default; got 64)."],
    ),
    (
        ServeConfig(backend="ttnn", dtype="float32"),
        [
            f"{P}.dtype = float32 is not available on backend ttnn (it computes in bfloat16 and "
            f"block floats): use auto or bfloat16, and {P}.precision for the weights."
        ],
    ),
    (
        ServeConfig(precision="mixed", device="cuda"),
        [
            f"{P}.precision = mixed on backend torch holds the card's weight formats for the "
            f"CPU's float32 kernels: it needs a CPU {P}.device and {P}.dtype auto or float32 "
            "(got device cuda, dtype auto)."
        ],
    ),
    (
        ServeConfig(backend="ttnn", precision="fp8"),
        [f"{P}.precision must be one of auto, bfloat16, mixed, bfp4-mlp (got fp8)."],
    ),
    (
        ServeConfig(prefill_chunk=96, block_size=64, prefix_caching=False),
        [
            f"{P}.prefillChunk (96) must be a multiple of {P}.blockSize (64): prefill chunks "
            "end on block boundaries."
        ],
    ),
    (
        ServeConfig(kv_blocks=1),
        [
            f"{P}.kvBlocks must be 0 (size from memory) or at least 2 (block 0 is reserved "
            "for padding; got 1)."
        ],
    ),
    (
        ServeConfig(max_model_len=-1),
        [f"{P}.maxModelLen must not be negative (0 = the model's own; got -1)."],
    ),
]


@pytest.mark.parametrize(("cfg", "messages"), REFUSED)
def test_new_rules_refuse(cfg: ServeConfig, messages: list[str]) -> None:
    assert validate(cfg) == messages
    out, err = io.StringIO(), io.StringIO()
    assert dry_run(cfg, out, err) != 0
    assert out.getvalue() == "" and err.getvalue() == "".join(m + "\n" for m in messages)


@pytest.mark.parametrize(
    "cfg",
    [
        ServeConfig(max_batch_size=64),  # torch has no batch cap (only ttnn: 32)
        ServeConfig(device="cuda", max_batch_size=256),
        ServeConfig(dtype="float32"),
        ServeConfig(backend="ttnn", dtype="bfloat16", precision="mixed"),
        ServeConfig(backend="ttnn", precision="bfloat16"),
        ServeConfig(kv_blocks=2),
        ServeConfig(max_model_len=32768),
        ServeConfig(prefill_chunk=96, block_size=32, prefix_caching=False),
    ],
)
def test_new_rules_accept(cfg: ServeConfig) -> None:
    assert validate(cfg) == []
    assert dry_run(cfg, io.StringIO(), io.StringIO()) == 0


def test_check_config_main(tmp_path: Path) -> None:
    good, bad, broken = tmp_path / "good.json", tmp_path / "bad.json", tmp_path / "broken.json"
    good.write_text(json.dumps({"backend": "ttnn", "prefixCaching": {"snapshotSlots": 8}}))
    bad.write_text(json.dumps({"backend": "ttnn", "deviceResident": True, "deviceArgmax": False}))
    broken.write_text("{not json")
    out = io.StringIO()
    assert check_config_main(str(good), out) == 0 and out.getvalue() == "OK\n"
    out = io.StringIO()
    assert check_config_main(str(bad), out) == 1
    assert f"{P}.deviceArgmax = true" in out.getvalue() and "OK" not in out.getvalue()
    out = io.StringIO()
    assert check_config_main(str(broken), out) == 2 and out.getvalue().startswith("error:")
    with pytest.raises(ConfigError):
        load_config_json(str(tmp_path / "missing.json"))


def test_dry_run() -> None:
    out, err = io.StringIO(), io.StringIO()
    assert dry_run(ServeConfig(port=9000), out, err) == 0
    assert json.loads(out.getvalue())["port"] == 9000 and err.getvalue() == ""
    out, err = io.StringIO(), io.StringIO()
    assert dry_run(ServeConfig(port=0), out, err) == 1
    assert out.getvalue() == "" and f"{P}.port must be in 1..65535 (got 0)." in err.getvalue()
