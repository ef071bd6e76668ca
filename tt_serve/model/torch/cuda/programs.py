"""GraphPrograms: the bucketed programs (``model/programs.py``: the registry and its rules)
replayed as CUDA graphs, or run eagerly (as ``tt/runtime/programs``).

A program returns its outputs. On CUDA (``capture=True``) every program is warmed up on a side
stream, captured once into a ``torch.cuda.CUDAGraph`` (all graphs share one memory pool) and
then replayed: the outputs returned are the static tensors written at capture time, overwritten
by every replay, so a caller copies what it needs before the next replay of the same key. With
``capture=False`` (the CPU twin, and the debugging path) ``run`` just calls the program: the
same buffers, the same kernels, no capture. A graph captures only device work: no host syncs in
a program.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from tt_serve.model.programs import Programs

Program = Callable[[], tuple[torch.Tensor, ...]]
Graph = tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]  # the graph and its outputs
WARMUP_RUNS = 2


class GraphPrograms(Programs[tuple[torch.Tensor, ...], Graph]):
    def __init__(self, device: torch.device, *, capture: bool) -> None:
        """``capture``: whether programs are registered as traced (captured, on CUDA only)."""
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device (got {device})")
        super().__init__()
        self.device = device
        self.capture = capture

    def _capture(self, todo: dict[Hashable, Program]) -> dict[Hashable, Graph]:
        """Warm up and capture each program into one shared pool (the largest buckets come
        first: later, smaller graphs then reuse the pool's blocks)."""
        pool = torch.cuda.graph_pool_handle()
        main = torch.cuda.current_stream(self.device)
        graphs: dict[Hashable, Graph] = {}
        with torch.no_grad():
            for key, program in todo.items():
                side = torch.cuda.Stream(self.device)
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    for _ in range(WARMUP_RUNS):
                        program()
                main.wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    outs = program()
                graphs[key] = (graph, outs)
        torch.cuda.synchronize(self.device)
        return graphs

    def _replay(self, handle: Graph) -> tuple[torch.Tensor, ...]:
        graph, outs = handle
        graph.replay()
        return outs

    def _eager(self, program: Program) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            return program()

    def _release(self, handle: Graph) -> None:
        """Nothing to do: a graph's memory goes with the last reference to it."""
