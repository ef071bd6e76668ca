"""tt_serve.config: serve flags, ServeConfig, check-config JSON, validate(), dry run.

The cross-check against the Nix rules lives in tests/nix/test_invariants.py."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from tt_serve.config import (
    GDN_CHUNK,
    ConfigError,
    ServeConfig,
    add_serve_arguments,
    check_config_main,
    config_from_json_dict,
    dry_run,
    load_config_json,
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


def test_bad_device_ids_are_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        parse("--device-ids", "0,x")


def test_resolved_dtype() -> None:
    assert ServeConfig().resolved_dtype == "float32"
    assert ServeConfig(device="cuda").resolved_dtype == "bfloat16"
    assert ServeConfig(backend="ttnn").resolved_dtype == "bfloat16"
    assert ServeConfig(dtype="float32", backend="ttnn").resolved_dtype == "float32"


def test_json_round_trip() -> None:
    cfg = ServeConfig(backend="ttnn", device_ids=(1, 3), prefix_caching=False, snapshot_slots=4)
    data = cfg.to_json_dict()
    assert data["prefixCaching"] == {"enable": False, "snapshotSlots": 4}
    assert data["deviceIds"] == [1, 3]
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


def test_validate_messages_name_nix_options() -> None:
    errors = validate(ServeConfig(device_resident=True, device_argmax=False, backend="ttnn"))
    assert errors == [
        f"{P}.deviceResident = true requires {P}.deviceArgmax = true "
        "(the decode loop feeds sampled ids back on the device; logits never leave it)."
    ]
    assert validate(ServeConfig(backend="ttnn", max_batch_size=33)) == [
        f"{P}.maxBatchSize must be in 1..32 on backend ttnn (got 33)."
    ]


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
