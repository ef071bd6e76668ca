"""Host tier: ``tt_serve.model.formats`` against tt-metal's own conversion in the ttnn==0.81.1
wheel, bit for bit (``probe_formats.py``, run by the ttnn venv under the mock cluster descriptor
that TILE host conversion needs). Skips without the venv unless ``REQUIRE_TTNN=1``."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tt_host.test_ttnn_host import _run, ttnn_python  # noqa: F401 (fixture)


def test_round_to_equals_ttnn_host_conversion_bit_for_bit(
    ttnn_python: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    out = _run(ttnn_python, "probe_formats.py", "", tmp_path, mock=True)
    cases = out["cases"]
    assert isinstance(cases, list)
    names = {c["name"] for c in cases}
    dtypes = {c["dtype"] for c in cases}
    assert dtypes == {"bfloat16", "bfloat8_b", "bfloat4_b"}
    assert {"ties", "subnormal", "all_zero_tile", "unaligned_33x47", "mixed_exponents"} <= names
    assert all(c["shape_ok"] for c in cases), cases
    bad = [c for c in cases if c["diff"]]
    assert not bad, json.dumps(bad, indent=1)
    # not vacuous: the block formats change every random value (a packer that returned its input
    # would agree with nothing above, but a probe that compared two identities would pass)
    lossy = [c for c in cases if c["dtype"] != "bfloat16" and c["name"] == "normal"]
    assert lossy and all(c["changed"] == c["n"] for c in lossy), lossy
