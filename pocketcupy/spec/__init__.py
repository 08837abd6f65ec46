"""Speculative decoding: proposers of draft tokens (verified by the engine's sampler). A proposer's
propose(requests) sets each request's draft_token_ids; the requests are at the decode point."""
from .draft_model import DraftModelProposer
from .mtp import MTPProposer
from .ngram import NgramProposer

__all__ = ["DraftModelProposer", "MTPProposer", "NgramProposer"]
