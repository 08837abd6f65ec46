"""A real SentencePiece tokenizer (tests/spm_tokenizer.py) and a model that carries it."""
import pytest

from pocketcupy.loader.gguf import read_metadata
from pocketcupy.tokenizer import Tokenizer

from tests import spm_tokenizer

pytest.importorskip("sentencepiece")


@pytest.fixture(scope="module")
def proto():
    return spm_tokenizer.train()


@pytest.fixture(scope="module")
def spm(proto):
    return Tokenizer.from_gguf_metadata(spm_tokenizer.gguf_keys(proto))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return spm_tokenizer.make_model(str(tmp_path_factory.mktemp("spm-model")))


def test_the_tokenizer_is_sentencepiece(proto, spm):
    """Our "llama" tokenizer encodes as the sentencepiece library does (the vocabulary is real)."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
    for text in ["the model and the server", "Run the server on 127.0.0.1:8000", "price: 5 €, über"]:
        assert spm.encode(text, add_special_tokens=False) == sp.encode(text)
        assert spm.decode(sp.encode(text)) == sp.decode(sp.encode(text)) == text


def test_synthetic_model_keeps_the_scores(model, proto):
    """make_synthetic_model's --tokenizer-gguf copies a SentencePiece vocabulary's scores (dropped
    before: every merge scored 0, so prompts were tokenized differently)."""
    meta = read_metadata(model)
    assert list(meta["tokenizer.ggml.scores"]) == pytest.approx(spm_tokenizer.gguf_keys(proto)["tokenizer.ggml.scores"])
    assert meta["tokenizer.ggml.model"] == "llama"
