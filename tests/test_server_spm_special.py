"""vLLM's add_special_tokens on the generation endpoints, with a tokenizer that writes a BOS (the real
SentencePiece one of tests/spm_tokenizer.py in a tiny random-weight model): completions add it to text
prompts unless told not to, chat adds it on top of the template only when asked."""
import pytest

from tests import spm_tokenizer
from tests.test_server_harness import request, serving, sse_events

pytest.importorskip("sentencepiece")

Q = [{"role": "user", "content": "the token"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serving(spm_tokenizer.make_model(str(tmp_path_factory.mktemp("spm-model"))))


def prompt_ids(server, path, body):
    status, r, _ = request(server, "POST", path, dict(body, model="smollm2", max_tokens=1, temperature=0,
                                                      return_token_ids=True))
    assert status == 200, r
    return r["prompt_token_ids"] if "prompt_token_ids" in r else r["choices"][0]["prompt_token_ids"]


def test_completions_add_special_tokens(server):
    plain = request(server, "POST", "/tokenize", {"prompt": "the token", "add_special_tokens": False})[1]["tokens"]
    assert prompt_ids(server, "/v1/completions", {"prompt": "the token"}) == [1] + plain
    assert prompt_ids(server, "/v1/completions", {"prompt": "the token", "add_special_tokens": False}) == plain
    # token-id prompts are taken as they are either way
    assert prompt_ids(server, "/v1/completions", {"prompt": plain, "add_special_tokens": True}) == plain


def test_chat_add_special_tokens(server):
    rendered = request(server, "POST", "/tokenize", {"messages": Q})[1]["tokens"]
    assert rendered[0] != 1 and prompt_ids(server, "/v1/chat/completions", {"messages": Q}) == rendered
    with_bos = prompt_ids(server, "/v1/chat/completions", {"messages": Q, "add_special_tokens": True})
    assert with_bos == [1] + rendered
    assert request(server, "POST", "/tokenize", {"messages": Q, "add_special_tokens": True})[1]["tokens"] == with_bos
    for path, body in (("/v1/chat/completions", {"messages": Q}), ("/v1/completions", {"prompt": "x"})):
        status, r, _ = request(server, "POST", path, dict(body, model="smollm2", add_special_tokens="yes"))
        assert status == 400 and r["error"]["param"] == "add_special_tokens", r


def test_echo_logprobs_offsets_with_a_bos(server):
    """echo with logprobs of a text prompt the tokenizer puts a BOS before: the BOS ("<s>", as vLLM names it)
    adds nothing to the echoed text (the client's), the first word starts it, and each text_offset is where
    its token starts in that text, streamed or not (the BOS counted 3 characters and the first word came
    with a space the text does not have: offsets 0, 3, 7, 13)."""
    body = {"model": "smollm2", "prompt": "the token is", "echo": True, "logprobs": 0, "max_tokens": 1,
            "temperature": 0}
    whole = request(server, "POST", "/v1/completions", body)[1]["choices"][0]
    status, events = sse_events(server, "/v1/completions", dict(body, stream=True))
    chunks = [c for e in events if e != "DONE" for c in e["choices"]]
    streamed = {"text": "".join(c["text"] for c in chunks),
                "logprobs": {key: [v for c in chunks if c["logprobs"] for v in c["logprobs"][key]]
                             for key in ("tokens", "text_offset")}}
    for c in (whole, streamed):
        tokens, offsets = c["logprobs"]["tokens"], c["logprobs"]["text_offset"]
        assert c["text"].startswith("the token is") and tokens[:4] == ["<s>", "the", " token", " is"], c
        assert offsets[:5] == [0, 0, 3, 9, 12], c
