"""Serve configuration: the dataclass, the ``serve`` flags, the invariant rules, check-config JSON.

One job per module; each imports only modules listed before it:

- :mod:`~tt_serve.config.serve_config`: the frozen :class:`ServeConfig` with every option's
  default (mirrored by ``modules/lib/defaults.nix``) and the constants it needs;
- :mod:`~tt_serve.config.flags`: the ``tt-serve serve`` flags, one per field;
- :mod:`~tt_serve.config.rules`: :func:`validate`, the rules ``modules/lib/invariants.nix``
  holds as NixOS assertions, with the same messages;
- :mod:`~tt_serve.config.nix_json`: configurations keyed by NixOS option names
  (``tt-serve check-config``, ``serve --dry-run``).

The names below are re-exported so that ``from tt_serve.config import ...`` keeps working.
"""

from __future__ import annotations

from tt_serve.config.flags import add_serve_arguments
from tt_serve.config.nix_json import (
    MODULE_ONLY_KEYS,
    ConfigError,
    check_config_main,
    config_from_json_dict,
    dry_run,
    load_config_json,
)
from tt_serve.config.rules import (
    MESH_SIDES,
    TTNN_BLOCK_ALIGN,
    TTNN_MAX_BATCH,
    validate,
)
from tt_serve.config.serve_config import (
    BACKENDS,
    DEFAULT_BATCH,
    DTYPES,
    GDN_CHUNK,
    LOG_LEVELS,
    MESH_PATTERN,
    NIX_PREFIX,
    PRECISIONS,
    RESUME_POINTS,
    ROUTER_POLICIES,
    ServeConfig,
    mesh_shape,
    parse_mesh,
    serve_flag_fields,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_BATCH",
    "DTYPES",
    "GDN_CHUNK",
    "LOG_LEVELS",
    "MESH_PATTERN",
    "MESH_SIDES",
    "MODULE_ONLY_KEYS",
    "NIX_PREFIX",
    "PRECISIONS",
    "RESUME_POINTS",
    "ROUTER_POLICIES",
    "TTNN_BLOCK_ALIGN",
    "TTNN_MAX_BATCH",
    "ConfigError",
    "ServeConfig",
    "add_serve_arguments",
    "check_config_main",
    "config_from_json_dict",
    "dry_run",
    "load_config_json",
    "mesh_shape",
    "parse_mesh",
    "serve_flag_fields",
    "validate",
]
