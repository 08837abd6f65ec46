"""Structured output: JSON schema / regex / choice / grammar -> a token bitmask per step (llguidance)."""
from .params import StructuredOutputsParams, as_structured_outputs

__all__ = ["StructuredOutputsParams", "StructuredOutputManager", "as_structured_outputs"]


def __getattr__(name):  # the manager imports llguidance's native module: load it on first use
    if name == "StructuredOutputManager":
        from .manager import StructuredOutputManager
        return StructuredOutputManager
    raise AttributeError(name)
