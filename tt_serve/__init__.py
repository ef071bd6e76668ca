"""tt-serve: serving for hybrid Qwen3.5 / Qwen3.6 / Qwen3-Next models, Tenstorrent first.

``from tt_serve import LLM, SamplingParams``. Importing the package loads neither torch nor
ttnn: ``LLM`` is resolved on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tt_serve.sequence import RequestError, RequestOutput, SamplingParams

if TYPE_CHECKING:
    from tt_serve.llm import LLM

__version__ = "0.1.0"
__all__ = ["LLM", "RequestError", "RequestOutput", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from tt_serve.llm import LLM

        return LLM
    raise AttributeError(f"module 'tt_serve' has no attribute {name!r}")
