"""``tt-serve plan --mesh``: the shapes a device opens as (model/tt/boards.py), and the per-axis links."""

from __future__ import annotations

import pytest

from tt_serve.cli import _plan_mesh
from tt_serve.model.tt.boards import device_spec


def test_plan_mesh_takes_the_shapes_tt_metal_opens() -> None:
    t3k, galaxy = device_spec("t3k"), device_spec("galaxy")
    assert _plan_mesh("2x4", t3k) == (2, 4) and _plan_mesh("1x8", t3k) == (1, 8)
    assert _plan_mesh("8x4", galaxy) == (8, 4) and _plan_mesh("4x8", galaxy) == (4, 8)
    with pytest.raises(ValueError, match="t3k opens as 1x8, 2x4, not 4x2"):
        _plan_mesh("4x2", t3k)
    with pytest.raises(ValueError, match="ROWSxCOLS"):
        _plan_mesh("8", t3k)


def test_links_per_axis_follow_the_mesh_orientation() -> None:
    """tt_transformers get_num_links: TG (4, 3) on (axis 0, axis 1) of its 8 x 4 mesh; the
    transposed 4 x 8 swaps them; one-link systems stay (1, 1)."""
    galaxy = device_spec("galaxy")
    assert galaxy.links_on((8, 4)) == (4, 3) and galaxy.links_on((4, 8)) == (3, 4)
    assert device_spec("t3k").links_on((2, 4)) == (1, 1)
    assert device_spec("p150").links_on((1, 1)) == (1, 1)
