"""Torch reference backend: the numerical reference and the backend that runs anywhere."""

from __future__ import annotations

from tt_serve.model.ref.backend import TorchBackend

__all__ = ["TorchBackend"]
