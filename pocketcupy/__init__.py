"""pocketcupy: an LLM inference engine on NumPy (CPU) and CuPy (GPU), without torch."""
from __future__ import annotations

__version__ = "0.1.0"

from .args import EngineArgs
from .outputs import CompletionOutput, EmbeddingRequestOutput, RequestOutput, ScoringRequestOutput
from .pooling import PoolingParams
from .sampling import RequestOutputKind, SamplingParams

__all__ = ["Engine", "AsyncEngine", "EngineArgs", "SamplingParams", "RequestOutputKind", "PoolingParams",
           "RequestOutput", "CompletionOutput", "EmbeddingRequestOutput", "ScoringRequestOutput", "__version__"]


def __getattr__(name):  # the engine pulls in the loaders and backends: import it on first use
    if name == "Engine":
        from .engine import Engine
        return Engine
    if name == "AsyncEngine":
        from .async_engine import AsyncEngine
        return AsyncEngine
    raise AttributeError(name)
