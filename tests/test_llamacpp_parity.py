"""The SmolLM2 GGUF against llama.cpp (fixtures from scripts/make_llamacpp_fixtures.py):
teacher-forced next-token log-probs over several paragraphs."""
import json
import os

import numpy as np
import pytest

from pocketcupy.sampler import log_softmax

from .conftest import FIXTURES
from .helpers import full_logits, load_reference_model

with open(os.path.join(FIXTURES, "llamacpp_logits.json")) as f:
    REF = json.load(f)


@pytest.fixture(scope="module")
def logprobs(smollm2_gguf):
    model, ops = load_reference_model(smollm2_gguf)
    return [log_softmax(full_logits(model, ops, p["ids"]).astype(np.float64)) for p in REF["paragraphs"]]


def test_top1_agreement(logprobs):
    agree = total = 0
    for p, lp in zip(REF["paragraphs"], logprobs):
        agree += int((lp.argmax(-1) == np.asarray(p["argmax"])).sum())
        total += len(p["argmax"])
    assert agree / total >= 0.98, f"top-1 agreement {agree / total:.4f}"


def test_next_token_logprob_difference(logprobs):
    diffs = []
    for p, lp in zip(REF["paragraphs"], logprobs):
        ids = np.asarray(p["ids"])
        ours = lp[np.arange(len(ids) - 1), ids[1:]]
        diffs.append(np.abs(ours - np.asarray(p["next_logprob"])))
    mean = float(np.concatenate(diffs).mean())
    assert mean <= 0.05, f"mean |Δ logprob| {mean:.4f}"
