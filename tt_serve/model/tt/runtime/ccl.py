"""The collectives of a tensor-parallel program on a ROWS x COLS mesh (``layout/parallel.py`` says what
each layer splits; this says how the pieces are put back together).

Every collective runs along one mesh axis (``cluster_axis`` 0: the rows' direction, down a
column; 1: along a row), independently on every line of that axis, as tt-metal's 2-D models
call them (models/tt_transformers/tt/ccl.py ``tt_all_reduce`` / ``tt_all_gather`` with
``cluster_axis``; models/demos/llama3_70b_galaxy/tt/llama_ccl.py). An axis of one chip has no
collective: the call is the identity, as ``tt_all_reduce`` skips it. Link counts are per axis
(tt_transformers ``get_num_links``: TG / BHGLX (4, 3), every other system the same on both).

``all_reduce`` (partial sums on every chip -> their sum, replicated) is tt_transformers'
``tt_all_reduce`` per axis: ``reduce_scatter_minimal_async`` on the hidden dim, then
``all_gather_async`` to replicate the sum again (its ``use_composite`` branch; on a 1 x N mesh
tt_transformers keeps the residual fractured and gathers in its distributed norm, this stack
keeps a replicated residual, one gather per reduction). On a 2-D mesh it scatters over axis 1,
then axis 0, and gathers back over axis 0, then axis 1. ``reduce_heads`` sums partials over the
columns only, for outputs whose hidden dim is split over the rows (``Placement.MIXER_ROW``), and
gathers the rows' pieces. Both ops are the experimental ones with caller-owned global
semaphores and a barrier semaphore, created here once before any capture: the plain
``ttnn.all_gather`` / ``all_reduce`` set up semaphores per call and are unsafe under trace
(tt-metal #48469, #43749). Semaphores are double-buffered per axis (TT_CCL keeps one cycle per
``cluster_axis``), and the cycles restart at every program's start (``restart``), so a
program's compile run, its capture and every replay use the same handles in the same order
(llama3_70b_galaxy resets its indices before capture for the same reason).
"""

from __future__ import annotations

from tt_serve.model.tt.ops import Ops, Tensor

SLOTS = 2  # double-buffered semaphore sets
GATHER_SEMAPHORES = 2  # "Default implementation requires 2 semaphores" (all_gather_async)
SCATTER_SEMAPHORES = 3  # "Expected 3 semaphores" (reduce_scatter_minimal_async)
AXES = (0, 1)


class _AxisSemaphores:
    """One axis's double-buffered semaphore sets and its cycle."""

    def __init__(self, ops: Ops) -> None:
        self.gather = [
            [ops.global_semaphore() for _ in range(GATHER_SEMAPHORES)] for _ in range(SLOTS)
        ]
        self.scatter = [
            [ops.global_semaphore() for _ in range(SCATTER_SEMAPHORES)] for _ in range(SLOTS)
        ]
        self.barrier = [ops.global_semaphore() for _ in range(SLOTS)]
        self.calls = 0

    def slot(self) -> int:
        slot = self.calls % SLOTS
        self.calls += 1
        return slot


class TensorParallelCCL:
    """Collectives over a ``mesh`` (rows, cols); on a one-chip axis every call is the identity.
    ``num_links``: links per collective, one count for both axes or (axis 0, axis 1)."""

    def __init__(
        self, ops: Ops, mesh: tuple[int, int] = (1, 1), num_links: int | tuple[int, int] = 1
    ) -> None:
        self.ops, self.mesh = ops, mesh
        self.links = (num_links, num_links) if isinstance(num_links, int) else num_links
        self._axes: dict[int, _AxisSemaphores] = {
            a: _AxisSemaphores(ops) for a in AXES if mesh[a] > 1
        }

    @property
    def degree(self) -> int:
        return self.mesh[0] * self.mesh[1]

    def restart(self) -> None:
        """Start every axis's semaphore cycle over (at the start of every program)."""
        for sems in self._axes.values():
            sems.calls = 0

    def all_gather(self, x: Tensor, dim: int, axis: int = 1) -> Tensor:
        """Every chip's ``x`` on the line of ``axis`` concatenated along ``dim`` (mesh order),
        on every chip of that line."""
        sems = self._axes.get(axis)
        if sems is None:
            return x
        s = sems.slot()
        return self.ops.all_gather(
            x,
            dim,
            cluster_axis=axis,
            semaphores=sems.gather[s],
            barrier=sems.barrier[s],
            num_links=self.links[axis],
        )

    def reduce_scatter(self, x: Tensor, dim: int, axis: int) -> Tensor:
        """The sum over the line of ``axis``, chunk i of ``dim`` left on its chip i."""
        sems = self._axes.get(axis)
        if sems is None:
            return x
        s = sems.slot()
        return self.ops.reduce_scatter(
            x,
            dim,
            cluster_axis=axis,
            semaphores=sems.scatter[s],
            barrier=sems.barrier[s],
            num_links=self.links[axis],
        )

    def gather_all(self, x: Tensor, dim: int) -> Tensor:
        """Every chip's ``x`` concatenated along ``dim`` in row-major chip order, on every
        chip: along the rows (axis 1), then down the columns (axis 0)."""
        return self.all_gather(self.all_gather(x, dim, 1), dim, 0)

    def gather_rows(self, x: Tensor) -> Tensor:
        """A column-parallel projection's row pieces [..., W/R] -> the column's [..., W]."""
        return self.all_gather(x, -1, 0)

    def all_reduce(self, x: Tensor) -> Tensor:
        """The sum over every chip of the partial sums ``x`` [..., H], replicated on every
        chip (H split over axis 1, then axis 0, and gathered back in reverse)."""
        part = self.reduce_scatter(self.reduce_scatter(x, -1, 1), -1, 0)
        return self.all_gather(self.all_gather(part, -1, 0), -1, 1)

    def reduce_heads(self, x: Tensor) -> Tensor:
        """Partial sums over the columns of a hidden-dim piece [..., H/R] (row r holds piece r)
        -> the whole sum [..., H], replicated on every chip."""
        summed = self.all_gather(self.reduce_scatter(x, -1, 1), -1, 1)
        return self.gather_rows(summed)
