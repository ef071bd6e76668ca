"""Programs: keyed by (phase, bucket), replayed as CUDA graphs or run eagerly (as ``tt/programs``).

A program is a closure over persistent input buffers and the pools; it returns its outputs.
On CUDA (``capture=True``) every program is warmed up on a side stream, captured once into a
``torch.cuda.CUDAGraph`` (all graphs share one memory pool) and then replayed: the outputs
returned are the static tensors written at capture time, overwritten by every replay, so a
caller copies what it needs before the next replay of the same key. With ``capture=False`` (the
CPU twin, and the debugging path) ``run`` just calls the program: the same buffers, the same
kernels, no capture.

Rules kept here: capture only after every pool and buffer exists (a graph keeps the addresses
it was captured with), capture only device work (no host syncs in a program), and warm up with
idle inputs (the scratch slot and the padding block only) so capture changes no sequence's
state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable

import torch

Program = Callable[[], tuple[torch.Tensor, ...]]
WARMUP_RUNS = 2


class Programs:
    def __init__(self, device: torch.device, *, capture: bool) -> None:
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device (got {device})")
        self.device = device
        self.capture = capture
        self._programs: dict[Hashable, Program] = {}
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        self.runs: Counter[Hashable] = Counter()  # replays (or eager runs) per key

    def add(self, key: Hashable, program: Program) -> None:
        if key in self._programs:
            raise ValueError(f"program {key!r} registered twice")
        self._programs[key] = program

    def __contains__(self, key: Hashable) -> bool:
        return key in self._programs

    @property
    def keys(self) -> tuple[Hashable, ...]:
        return tuple(self._programs)

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def capture_all(self) -> None:
        """Warm up and capture every registered program, in registration order (register the
        largest buckets first: later, smaller graphs then reuse the shared pool's blocks)."""
        if not self.capture:
            return
        pool = torch.cuda.graph_pool_handle()
        main = torch.cuda.current_stream(self.device)
        with torch.no_grad():
            for key, program in self._programs.items():
                if key in self._graphs:
                    continue
                side = torch.cuda.Stream(self.device)
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    for _ in range(WARMUP_RUNS):
                        program()
                main.wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    outs = program()
                self._graphs[key] = (graph, outs)
        torch.cuda.synchronize(self.device)

    def run(self, key: Hashable) -> tuple[torch.Tensor, ...]:
        self.runs[key] += 1
        if self.capture:
            graph, outs = self._graphs[key]
            graph.replay()
            return outs
        with torch.no_grad():
            return self._programs[key]()

    def release(self) -> None:
        self._graphs.clear()
