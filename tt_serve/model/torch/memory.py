"""What the torch backend reads of a device's memory: free and total bytes, and the caching
allocator's allocated and peak bytes (``CudaMemory``; the GPU sizing in ``launch.py`` and the
profile step in ``backend.py`` take any ``DeviceMemory``, a stub in the CPU tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class DeviceMemory(Protocol):
    """What the GPU sizing reads of a device's memory (``CudaMemory``; a stub in tests)."""

    def info(self) -> tuple[int, int]:
        """(free, total) bytes of the device."""
        ...

    def reset_peak(self) -> None: ...

    def allocated(self) -> int:
        """Bytes this process's tensors hold now."""
        ...

    def peak(self) -> int:
        """The most ``allocated`` reached since ``reset_peak``."""
        ...

    def release_cached(self) -> None:
        """Hand the allocator's cached, unused blocks back to the device."""
        ...


@dataclass(frozen=True)
class CudaMemory:
    device: Any  # torch.device

    def info(self) -> tuple[int, int]:
        import torch

        free, total = torch.cuda.mem_get_info(self.device)
        return int(free), int(total)

    def reset_peak(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self) -> int:
        import torch

        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        import torch

        return int(torch.cuda.max_memory_allocated(self.device))

    def release_cached(self) -> None:
        import torch

        torch.cuda.empty_cache()
