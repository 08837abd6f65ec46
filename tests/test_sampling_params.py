import math

import numpy as np
import pytest

from pocketcupy.sampling import SamplingParams

BAD = [
    ("n", 0),
    ("n", -1),
    ("n", True),
    ("n", 1.0),
    ("best_of", 2),
    ("best_of", 1.5),
    ("presence_penalty", 2.5),
    ("presence_penalty", -2.01),
    ("presence_penalty", "0"),
    ("presence_penalty", math.nan),
    ("frequency_penalty", 3.0),
    ("frequency_penalty", -3.0),
    ("frequency_penalty", None),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", math.inf),
    ("repetition_penalty", math.nan),
    ("temperature", -0.1),
    ("temperature", math.inf),
    ("temperature", math.nan),
    ("temperature", "1"),
    # past a float32's range the samplers' logits became NaN and a token allowed_token_ids masks was drawn
    ("temperature", 1e39),
    ("repetition_penalty", 1e39),
    ("repetition_penalty", 1e-39),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_p", -0.1),
    ("top_p", math.nan),
    ("top_k", -2),
    ("top_k", 1.5),
    ("top_k", True),
    ("min_p", -0.1),
    ("min_p", 1.1),
    ("min_p", math.nan),
    ("seed", 1.5),
    ("seed", "1"),
    ("seed", True),
    ("stop", ""),
    ("stop", ["ok", ""]),
    ("stop", ["ok", 3]),
    ("stop", 3),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", [1.0]),
    ("stop_token_ids", 5),
    ("stop_token_ids", [True]),
    ("preserved_token_ids", [-1]),
    ("preserved_token_ids", [True]),
    ("preserved_token_ids", 5),
    ("preserved_token_ids", 0),       # falsy non-lists too
    ("preserved_token_ids", False),
    ("preserved_token_ids", ""),
    ("preserved_token_ids", {}),
    ("ignore_eos", 1),
    ("detokenize", None),
    ("skip_special_tokens", None),
    ("include_stop_str_in_output", "yes"),
    ("spaces_between_special_tokens", None),
    ("max_tokens", 0),
    ("max_tokens", -5),
    ("max_tokens", 2.0),
    ("min_tokens", -1),
    ("min_tokens", 17),  # > default max_tokens=16
    ("min_tokens", 0.5),
    ("logprobs", -1),
    ("logprobs", 21),
    ("logprobs", 1.0),
    ("prompt_logprobs", -1),
    ("prompt_logprobs", 21),
    ("prompt_logprobs", "5"),
    ("logit_bias", [1, 2]),
    ("logit_bias", {-1: 1.0}),
    ("logit_bias", {"5": 1.0}),
    ("logit_bias", {True: 1.0}),
    ("logit_bias", {5: 100.5}),
    ("logit_bias", {5: math.nan}),
    ("logit_bias", {5: "1"}),
    ("allowed_token_ids", []),
    ("allowed_token_ids", [-1]),
    ("allowed_token_ids", 5),
    ("allowed_token_ids", [1.5]),
    ("bad_words", "word"),
    ("bad_words", [""]),
    ("bad_words", ["  "]),
    ("bad_words", [3]),
    ("truncate_prompt_tokens", 0),
    ("truncate_prompt_tokens", -2),
    ("truncate_prompt_tokens", 1.5),
]


@pytest.mark.parametrize("field,value", BAD)
def test_invalid_values_raise(field, value):
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: value})
    assert str(e.value).startswith(f"{field}:")


def test_message_format():
    with pytest.raises(ValueError, match=r"^top_p: must be in \(0, 1\], got 1.5$"):
        SamplingParams(top_p=1.5)


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.best_of, p.temperature, p.top_p, p.top_k, p.min_p) == (1, None, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.max_tokens, p.min_tokens, p.logprobs, p.prompt_logprobs, p.seed) == (16, 0, None, None, None)
    assert p.stop == [] and p.stop_token_ids == []
    assert p.skip_special_tokens and p.spaces_between_special_tokens and not p.ignore_eos and not p.include_stop_str_in_output
    assert not p.greedy


@pytest.mark.parametrize(
    "kw",
    [
        dict(best_of=1),
        dict(n=3, best_of=3),
        dict(top_k=-1),
        dict(top_k=50, top_p=0.9, min_p=0.05),
        dict(temperature=0),
        dict(presence_penalty=-2, frequency_penalty=2, repetition_penalty=1.3),
        dict(max_tokens=None, min_tokens=1000),
        dict(max_tokens=4, min_tokens=4),
        dict(logprobs=0, prompt_logprobs=20),
        dict(seed=np.int64(7)),
        dict(stop_token_ids=(1, 2)),
    ],
)
def test_valid_values(kw):
    SamplingParams(**kw)


def test_stop_normalised_to_list():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(stop_token_ids=(3,)).stop_token_ids == [3]


def test_greedy_threshold():
    assert SamplingParams(temperature=0.0).greedy
    assert SamplingParams(temperature=9e-6).greedy
    assert not SamplingParams(temperature=1e-5).greedy


def test_clone():
    p = SamplingParams(stop=["x"], stop_token_ids=[5], top_k=3)
    q = p.clone(temperature=0.5)
    assert q.temperature == 0.5 and q.top_k == 3 and q.stop == ["x"] and q.stop_token_ids == [5]
    q.stop.append("y")
    assert p.stop == ["x"]
    with pytest.raises(ValueError, match="^top_p:"):
        p.clone(top_p=2.0)


def test_logit_bias_normalised():
    p = SamplingParams(logit_bias={np.int64(7): 3, 2: -100})
    assert p.logit_bias == {7: 3.0, 2: -100.0} and all(type(k) is int and type(v) is float for k, v in p.logit_bias.items())
    assert SamplingParams(logit_bias={}).logit_bias is None
    q = p.clone()
    q.logit_bias[1] = 1.0
    assert 1 not in p.logit_bias
