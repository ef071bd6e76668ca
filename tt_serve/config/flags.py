"""The ``tt-serve serve`` flags: one argparse flag per :class:`ServeConfig` field.

A field's ``--help`` line, default and choices are read from the field itself
(:mod:`tt_serve.config.serve_config`); the replica topology fields are not flags.
"""

from __future__ import annotations

import argparse
from typing import Any

from tt_serve.config.serve_config import serve_flag_fields


def _device_ids(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of ints: {text!r}"
        ) from exc


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Define one ``tt-serve serve`` flag per ServeConfig field, with its help and default."""
    for f in serve_flag_fields():
        flag = "--" + f.name.replace("_", "-")
        meta = f.metadata
        shown = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
        shown = "auto" if meta.get("auto") and f.default is None else shown
        help_text = f"{meta['help']} (default: {shown})"
        kw: dict[str, Any] = {"default": f.default, "help": help_text}
        if isinstance(f.default, bool) or meta.get("auto"):
            kw["action"] = argparse.BooleanOptionalAction
        elif f.name == "device_ids":
            kw["type"] = _device_ids
        elif isinstance(f.default, int):
            kw["type"] = int
        elif isinstance(f.default, float):
            kw["type"] = float
        if "choices" in meta:
            kw["choices"] = meta["choices"]
        parser.add_argument(flag, **kw)
    parser.add_argument(
        "--dry-run", action="store_true", help="validate, print the resolved config, exit"
    )
