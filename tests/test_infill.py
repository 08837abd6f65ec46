"""Fill in the middle (completions' `suffix`): a code model's marker tokens found from GGUF metadata
or by their text, the prompt in llama.cpp's order, and the completions route building it (in
process, on the real SmolLM2 given three of its special tokens as markers: it has none of its own,
so its server refuses `suffix` naming the field)."""
import pytest

from pocketcupy import EngineArgs, SamplingParams
from pocketcupy.infill import infill_prompt
from pocketcupy.server.app import create_app
from pocketcupy.server.state import ServerConfig, ServerState
from pocketcupy.tokenizer import Tokenizer

from tests.test_server_harness import MODEL, request, server  # noqa: F401
from tests.test_tokenizer import _spm_meta

FIM = ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]


def _with_fim(**over):
    meta = _spm_meta(**over)
    n = len(meta["tokenizer.ggml.tokens"])
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + FIM
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"] + [3, 3, 3]
    meta["tokenizer.ggml.scores"] = meta["tokenizer.ggml.scores"] + [0.0] * 3
    return Tokenizer.from_gguf_metadata(meta), n


def test_markers_from_metadata_or_their_text():
    tok, n = _with_fim()
    assert tok.fim_ids == (n, n + 1, n + 2)
    named, _ = _with_fim(**{"tokenizer.ggml.fim_pre_token_id": 2, "tokenizer.ggml.fim_suf_token_id": 1,
                            "tokenizer.ggml.fim_mid_token_id": 0})
    assert named.fim_ids == (2, 1, 0)   # a GGUF's own names win
    assert Tokenizer.from_gguf_metadata(_spm_meta()).fim_ids is None


def test_prompt_order():
    tok, n = _with_fim()
    hello, world = tok.encode("hello", add_special_tokens=False), tok.encode("world", add_special_tokens=False)
    assert infill_prompt(tok, hello, "world") == [tok.bos_token_id, n, *hello, n + 1, *world, n + 2]
    with pytest.raises(ValueError, match="^suffix: this model has no fill-in-the-middle tokens"):
        infill_prompt(Tokenizer.from_gguf_metadata(_spm_meta()), hello, "world")


@pytest.fixture(scope="module")
def fim_state(smollm2_gguf):
    state = ServerState(ServerConfig(engine_args=EngineArgs(model=smollm2_gguf, device="cpu", progress=False),
                                     served_model_names=[MODEL]))
    state.load()
    state.engine.tokenizer.fim_ids = (3, 5, 6)   # <repo_name>, <file_sep>, <filename>
    yield state
    state.shutdown(30)


def test_completions_between_prompt_and_suffix(fim_state):
    tok = fim_state.engine.tokenizer
    prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
    body = {"model": MODEL, "prompt": [prefix, "x = "], "suffix": suffix, "max_tokens": 8, "temperature": 0,
            "return_token_ids": True, "echo": True}
    resp = create_app(fim_state).test_client().post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.get_json()
    choices = resp.get_json()["choices"]
    for c, text in zip(choices, [prefix, "x = "]):
        want = [3, *tok.encode(text, add_special_tokens=False), 5, *tok.encode(suffix, add_special_tokens=False), 6]
        assert c["prompt_token_ids"] == want
        out = fim_state.engine.generate(want, SamplingParams(temperature=0, max_tokens=8))[0].outputs[0]
        assert c["token_ids"] == out.token_ids and c["text"] == text + out.text   # echo: the prompt, not the suffix
    bad = create_app(fim_state).test_client().post("/v1/completions", json={
        "model": MODEL, "prompt": "x", "suffix": "y", "truncate_prompt_tokens": 4})
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "truncate_prompt_tokens"


def test_echo_with_logprobs_refused_with_suffix(fim_state):
    """echo with logprobs and suffix: a 400 naming echo (the logprobs were the fill-in-the-middle prompt's,
    markers and suffix included, their text_offset past the echoed text); echo alone, logprobs alone stay."""
    client = create_app(fim_state).test_client()
    body = {"model": MODEL, "prompt": "x = ", "suffix": "\nprint(x)", "max_tokens": 2, "temperature": 0}
    for extra in ({"echo": True, "logprobs": 0}, {"echo": True, "logprobs": 1, "stream": True}):
        resp = client.post("/v1/completions", json=dict(body, **extra))
        assert resp.status_code == 400 and resp.get_json()["error"]["param"] == "echo", resp.get_json()
    echo = client.post("/v1/completions", json=dict(body, echo=True)).get_json()["choices"][0]
    lps = client.post("/v1/completions", json=dict(body, logprobs=1)).get_json()["choices"][0]
    assert echo["text"].startswith("x = ") and lps["logprobs"]["text_offset"][0] == 0


def test_a_model_without_markers_refuses_suffix(server):
    status, body, _ = request(server, "POST", "/v1/completions", {"model": MODEL, "prompt": "x = ", "suffix": "\n"})
    assert status == 400 and body["error"]["param"] == "suffix" and "fill-in-the-middle" in body["error"]["message"]
