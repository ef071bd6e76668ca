"""Torch reference backend: the numerical reference (one eager forward) and the backend that runs
anywhere; its optional CUDA-graph path lives in ``model/cuda``."""

from __future__ import annotations

from tt_serve.model.ref.backend import TorchBackend

__all__ = ["TorchBackend"]
