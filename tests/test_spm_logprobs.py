"""Log-probability token strings of a real SentencePiece tokenizer (tests/spm_tokenizer.py): a
token's '▁' is the space it is in the text (decode([id]) alone drops it, as a sequence's start), a
byte-fallback token's bytes are its byte; in the engine's decoded_token, chat's token / bytes /
top_logprobs, completions' tokens / top_logprobs / text_offset, prompt_logprobs and the Responses
API's output_text logprobs. Byte-level BPE (SmolLM2) stays decode([id])."""
import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.loader.gguf import read_metadata
from pocketcupy.tokenizer import Tokenizer

from tests import spm_tokenizer
from tests.test_server_harness import serving

pytest.importorskip("sentencepiece")

WORDS = ["▁the", "▁token", "▁and", "▁batch", "s", "ing", "."]   # pieces a generation is kept to
EURO = ["<0xE2>", "<0x82>", "<0xAC>"]                               # '€' (not in the README) as bytes


@pytest.fixture(scope="module")
def proto():
    return spm_tokenizer.train()


@pytest.fixture(scope="module")
def spm(proto):
    return Tokenizer.from_gguf_metadata(spm_tokenizer.gguf_keys(proto))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return spm_tokenizer.make_model(str(tmp_path_factory.mktemp("spm-model")))


def ids(tok, pieces):
    return [tok._tokens.index(p) for p in pieces]


def test_the_tokenizer_is_sentencepiece(proto, spm):
    """Our "llama" tokenizer encodes as the sentencepiece library does (the vocabulary is real)."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
    for text in ["the model and the server", "Run the server on 127.0.0.1:8000", "price: 5 €, über"]:
        assert spm.encode(text, add_special_tokens=False) == sp.encode(text)
        assert spm.decode(sp.encode(text)) == sp.decode(sp.encode(text)) == text


def test_logprob_token_keeps_the_space(spm):
    the, s, e2 = ids(spm, ["▁the", "s", "<0xE2>"])
    assert spm.decode([the]) == "the" and spm.logprob_token(the) == " the"
    assert spm.logprob_token(the, at_start=True) == "the" and spm.logprob_token(s) == "s"
    assert spm.logprob_token(e2) == "\ufffd" and spm.token_bytes(e2) == b"\xe2"
    assert spm.logprob_token(spm.eos_token_id) == "</s>"


def test_byte_level_logprob_token_is_decode(smollm2_gguf):
    """SmolLM2's byte-level BPE: every token's logprob string is decode([id]), as before."""
    tok = Tokenizer.from_gguf(smollm2_gguf)
    assert all(tok.logprob_token(i) == tok.decode([i]) for i in range(tok.vocab_size))


def test_synthetic_model_keeps_the_scores(model, proto):
    """make_synthetic_model's --tokenizer-gguf copies a SentencePiece vocabulary's scores (dropped
    before: every merge scored 0, so prompts were tokenized differently)."""
    meta = read_metadata(model)
    assert list(meta["tokenizer.ggml.scores"]) == pytest.approx(spm_tokenizer.gguf_keys(proto)["tokenizer.ggml.scores"])
    assert meta["tokenizer.ggml.model"] == "llama"


def test_engine_decoded_tokens(model):
    engine = Engine(model, device="cpu", progress=False)
    tok = engine.tokenizer
    words = ids(tok, WORDS)
    prompt = tok.encode("the token")
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=3, logprobs=3, prompt_logprobs=2,
                       allowed_token_ids=words)
    out = engine.generate({"prompt_token_ids": prompt}, p)[0]
    o = out.outputs[0]
    assert "".join(pos[t].decoded_token for t, pos in zip(o.token_ids, o.logprobs)) == o.text
    assert " " in o.text
    for pos in o.logprobs:
        assert all(lp.decoded_token == tok.id_to_piece(t) for t, lp in pos.items())
    assert out.prompt_logprobs[0] is None
    assert [pos[t].decoded_token for t, pos in zip(prompt[1:], out.prompt_logprobs[1:])] == [" the", " token"]


@pytest.fixture(scope="module")
def client(model):
    from openai import OpenAI

    for server in serving(model):
        c = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        yield c, Tokenizer.from_gguf(model)


def test_chat_logprobs(client):
    c, tok = client
    words = ids(tok, WORDS)
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "the token"}], max_tokens=10, seed=1,
              logprobs=True, top_logprobs=3, extra_body={"allowed_token_ids": words})
    r = c.chat.completions.create(**kw).choices[0]
    content = r.logprobs.content
    assert "".join(e.token for e in content) == r.message.content and " " in r.message.content
    for e in content:
        assert [e.token] + [t.token for t in e.top_logprobs] == [
            bytes(x.bytes).decode() for x in [e, *e.top_logprobs]]
    streamed = [e for ch in c.chat.completions.create(**kw, stream=True) if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]


def test_chat_byte_fallback_bytes(client):
    """Byte tokens: each entry's bytes are its byte (a part of '€'), its token U+FFFD."""
    c, tok = client
    euro = ids(tok, EURO)
    r = c.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "€"}], max_tokens=6,
                                  seed=2, logprobs=True, top_logprobs=2, extra_body={"allowed_token_ids": euro})
    content = r.choices[0].logprobs.content
    assert {bytes(e.bytes) for e in content} <= {b"\xe2", b"\x82", b"\xac"} and {e.token for e in content} == {"\ufffd"}
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == r.choices[0].message.content


def test_completions_logprobs_echo_and_prompt_logprobs(client):
    c, tok = client
    words = ids(tok, WORDS)
    prompt = [words[0], words[1]]   # '▁the ▁token', no BOS: the echoed text starts "the"
    r = c.completions.create(model="smollm2", prompt=prompt, max_tokens=8, seed=4, echo=True, logprobs=2,
                             extra_body={"allowed_token_ids": words, "prompt_logprobs": 1}).choices[0]
    lp = r.logprobs
    assert r.text.startswith("the token") and "".join(lp.tokens) == r.text and lp.tokens[:2] == ["the", " token"]
    assert [r.text[o:o + len(t)] for t, o in zip(lp.tokens, lp.text_offset)] == lp.tokens
    shown = [k for top in lp.top_logprobs[2:] for k in top]   # the generated tokens' alternatives
    assert set(shown) <= {" the", " token", " and", " batch", "s", "ing", "."} and " and" in shown
    pl = r.model_extra["prompt_logprobs"]
    assert pl[0] is None and pl[1][str(words[1])]["decoded_token"] == " token"


def test_responses_output_text_logprobs(client):
    """(The Responses API takes no allowed_token_ids: the greedy output of the random model, and its
    alternatives, some of them words with their space.)"""
    c, _ = client
    r = c.responses.create(model="smollm2", input="the token", max_output_tokens=16, temperature=0, top_logprobs=5,
                           include=["message.output_text.logprobs"])
    part = r.output[0].content[0]
    entries = part.logprobs + [t for e in part.logprobs for t in e.top_logprobs]
    assert all(e.token == bytes(e.bytes).decode("utf-8", "replace") for e in entries)
    assert any(e.token.startswith(" ") and len(e.token) > 1 for e in entries)
