"""The collectives of a tensor-parallel program on a 1 x N mesh (``parallel.py`` says what
each layer splits; this says how the pieces are put back together).

``all_reduce`` is tt_transformers' ``tt_all_reduce`` for 1 x N meshes
(models/tt_transformers/tt/ccl.py): ``reduce_scatter_minimal_async`` on the hidden dim, then
``all_gather_async`` to replicate the sum again (tt_transformers keeps the residual fractured
and gathers in its distributed norm; this stack keeps a replicated residual, one gather per
reduction). Both are the experimental ops with caller-owned global semaphores and a barrier
semaphore, created here once before any capture: the plain ``ttnn.all_gather`` / ``all_reduce``
set up semaphores per call and are unsafe under trace (tt-metal #48469, #43749). Semaphores are
double-buffered (consecutive CCLs never share one, as TT_CCL cycles them), and the cycle
restarts at every program's start (``restart``), so a program's compile run, its capture and
every replay use the same handles in the same order (llama3_70b_galaxy resets its indices
before capture for the same reason).
"""

from __future__ import annotations

from typing import Any

from tt_serve.model.tt.ops import Ops, Tensor

SLOTS = 2  # double-buffered semaphore sets
GATHER_SEMAPHORES = 2  # "Default implementation requires 2 semaphores" (all_gather_async)
SCATTER_SEMAPHORES = 3  # "Expected 3 semaphores" (reduce_scatter_minimal_async)


class TensorParallelCCL:
    """Collectives over ``degree`` chips; with degree 1 every call is the identity."""

    def __init__(self, ops: Ops, degree: int, num_links: int = 1) -> None:
        self.ops, self.degree, self.num_links = ops, degree, num_links
        self._gather: list[list[Any]] = []
        self._scatter: list[list[Any]] = []
        self._barrier: list[Any] = []
        if degree > 1:
            self._gather = [
                [ops.global_semaphore() for _ in range(GATHER_SEMAPHORES)] for _ in range(SLOTS)
            ]
            self._scatter = [
                [ops.global_semaphore() for _ in range(SCATTER_SEMAPHORES)] for _ in range(SLOTS)
            ]
            self._barrier = [ops.global_semaphore() for _ in range(SLOTS)]
        self._calls = 0

    def restart(self) -> None:
        """Start the semaphore cycle over (at the start of every program)."""
        self._calls = 0

    def _slot(self) -> int:
        slot = self._calls % SLOTS
        self._calls += 1
        return slot

    def all_gather(self, x: Tensor, dim: int) -> Tensor:
        """Every chip's ``x`` concatenated along ``dim`` (mesh order), on every chip."""
        if self.degree == 1:
            return x
        s = self._slot()
        return self.ops.all_gather(
            x,
            dim,
            semaphores=self._gather[s],
            barrier=self._barrier[s],
            num_links=self.num_links,
        )

    def all_reduce(self, x: Tensor) -> Tensor:
        """The sum over chips of the partial sums ``x`` [..., H], replicated on every chip."""
        if self.degree == 1:
            return x
        s = self._slot()
        part = self.ops.reduce_scatter(
            x,
            -1,
            semaphores=self._scatter[s],
            barrier=self._barrier[s],
            num_links=self.num_links,
        )
        return self.all_gather(part, -1)
