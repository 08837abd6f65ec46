"""Speculative decoding: proposers of draft tokens (verified by the engine's sampler)."""
from .ngram import NgramProposer

__all__ = ["NgramProposer"]
