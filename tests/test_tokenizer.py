import json
import os

import pytest

from pocketcupy.tokenizer import IncrementalDetokenizer, Tokenizer

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

TEXTS = [
    "", " ", "Hello world", "  multiple   spaces  ", "\ttab\n\nnewlines\r\n", "\n\n\n",
    "café naïve résumé über Müller", "Tiếng Việt: Nguyễn", "emoji 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "日本語のテキスト。我喜欢学习。한국어", "Привет, мир!", "مرحبا بالعالم",
    "def f(x):\n    return x ** 2  # ok\n", "1234567 3.14159 1,000,000", "don't I'll WE'RE it's",
    "<|im_start|>user\nhi<|im_end|>\n", "a<|im_end|>b<|endoftext|>", "<|im_start|", "\u00a0\u2003\u200b",
]


@pytest.fixture(scope="module")
def smol(smollm2_gguf):
    return Tokenizer.from_gguf(smollm2_gguf)


# --- SmolLM2 GGUF (byte-level BPE, pre "smollm") -------------------------------------------------
def test_smollm2_properties(smol):
    assert smol.vocab_size == 49152
    assert smol.bos_token_id == 1 and smol.eos_token_id == 2
    assert smol.add_bos is False
    assert {0, 2} <= smol.eos_token_ids  # <|im_end|> (eos) and <|endoftext|>
    assert {0, 1, 2} <= smol.special_token_ids
    assert smol.chat_template and "<|im_start|>" in smol.chat_template


def test_smollm2_special_tokens_parsed(smol):
    ids = smol.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert ids == [1, 4093, 198, 6004, 2]
    assert smol.encode("x<|endoftext|>y")[1] == 0
    # a broken marker is ordinary text
    assert 1 not in smol.encode("<|im_start|")


def test_smollm2_known_ids(smol):
    assert smol.encode("Hello world") == [19556, 905]
    # digits are split one by one (pre-tokenizer "smollm")
    assert smol.encode("12345") == [33, 34, 35, 36, 37]


def test_llamacpp_fixture(smol, smollm2_gguf):
    path = os.path.join(FIXTURES, "llamacpp_tokenize.json")
    if not os.path.exists(path):
        pytest.skip("tests/fixtures/llamacpp_tokenize.json not generated yet (scripts/make_llamacpp_fixtures.py)")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    from pocketcupy.model_cache import _sha256
    assert data["model_sha256"] == _sha256(smollm2_gguf), "fixture was made from another GGUF file"
    assert data["cases"]
    bad = [(c["text"], c["ids"], smol.encode(c["text"], add_special_tokens=False))
           for c in data["cases"] if smol.encode(c["text"], add_special_tokens=False) != c["ids"]]
    assert not bad, f"{len(bad)} cases differ from llama.cpp, first: {bad[0]}"


def test_llama_cpp_python_if_installed(smol, smollm2_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=smollm2_gguf, vocab_only=True, verbose=False)
    for text in TEXTS:
        want = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        assert smol.encode(text, add_special_tokens=False) == want, text


@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_roundtrip(smol, text):
    ids = smol.encode(text)
    assert smol.decode(ids) == text
    assert b"".join(smol.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_bytelevel_bytes_of_any_text():
    """A byte-level vocabulary entry -> its bytes: each byte-level character its byte, any other
    character its UTF-8 bytes (U+0080..U+00FF among them, which are no Latin-1 byte there)."""
    from pocketcupy.tokenizer_gguf import BYTE_ENCODER, bytelevel_bytes

    every_byte = "".join(BYTE_ENCODER[b] for b in range(256))
    assert bytelevel_bytes(every_byte) == bytes(range(256))
    assert bytelevel_bytes("Ġhello") == b" hello"
    for other in ("\x85", "a\u00adb", "\u00a0x", "\u65e5\u672c", "\x00\x7f"):
        assert bytelevel_bytes(other) == other.encode("utf-8"), other
    assert bytelevel_bytes("Ġ\u00ad\u65e5") == b" " + "\u00ad\u65e5".encode("utf-8")


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_matches_decode(smol, text):
    ids = smol.encode(text)
    for skip in (False, True):
        detok = IncrementalDetokenizer(smol, prompt_ids=[1, 2, 3], skip_special_tokens=skip)
        deltas = [detok.push(i) for i in ids]
        assert "".join(deltas) + detok.flush() == smol.decode(ids, skip_special_tokens=skip)
        assert all("\ufffd" not in d for d in deltas)


def test_incremental_holds_back_partial_utf8(smol):
    ids = smol.encode("😀")
    assert len(ids) > 1  # the emoji's four bytes span several tokens
    detok = IncrementalDetokenizer(smol)
    deltas = [detok.push(i) for i in ids]
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == "😀"


def test_incremental_broken_sequence(smol):
    lead = smol.encode("😀")[0]  # starts a 4-byte sequence that the next token does not continue
    detok = IncrementalDetokenizer(smol)
    out = detok.push(lead)
    out += detok.push(smol.encode("a")[0])
    assert out == smol.decode([lead, smol.encode("a")[0]]) == "\ufffda"
    detok = IncrementalDetokenizer(smol)
    assert detok.push(lead) == "" and detok.flush() == "\ufffd"


def test_skip_special_and_pieces(smol):
    ids = smol.encode("<|im_start|>assistant\nHi!<|im_end|>")
    assert smol.decode(ids, skip_special_tokens=True) == "assistant\nHi!"
    assert smol.id_to_piece(2) == "<|im_end|>"
    assert smol.id_to_piece(smol.encode(" world")[0]) == " world"
    assert smol.token_bytes(smol.encode("\n")[0]) == b"\n"


def test_errors(smol):
    with pytest.raises(ValueError, match="out of range"):
        smol.decode([smol.vocab_size])
    with pytest.raises(ValueError, match="out of range"):
        smol.id_to_piece(-1)
    with pytest.raises(ValueError):
        smol.encode(None)
    with pytest.raises(ValueError, match="index 1"):
        smol.encode("a\ud83db")


# --- GGUF metadata variants ----------------------------------------------------------------------
def test_unsupported_model_and_pre():
    with pytest.raises(ValueError, match="'bert'"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(ValueError, match="'no-such-pre'"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "no-such-pre",
                                      "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.merges": []})


def test_bpe_without_merges_key():
    """llama.cpp refuses it; we silently tokenized byte by byte (prompts the model never saw)."""
    with pytest.raises(ValueError, match="no tokenizer.ggml.merges"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]})


@pytest.mark.parametrize("pre", ["default", "gpt2", "llama-bpe", "qwen2", "smollm", "starcoder",
                                 "deepseek-llm", "deepseek-coder", "deepseek-v3", "tekken", "gpt-4o", "falcon"])
def test_bpe_pre_types_build_and_roundtrip(pre):
    # a byte-level vocabulary of the 256 byte characters and no merges: every byte is a token
    from pocketcupy.tokenizer_gguf import BYTE_ENCODER
    tokens = [BYTE_ENCODER[b] for b in range(256)] + ["<|end|>"]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": [], "tokenizer.ggml.token_type": [1] * 256 + [3],
            "tokenizer.ggml.eos_token_id": 256}
    tok = Tokenizer.from_gguf_metadata(meta)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    assert tok.encode("a<|end|>")[-1] == 256 and 256 in tok.eos_token_ids


# --- SentencePiece ("llama") with a synthetic vocabulary -----------------------------------------
def _spm_meta(**over):
    normal = ["▁", "▁h", "▁he", "▁hel", "▁hell", "▁hello", "h", "e", "l", "o", "w", "r", "d",
              "▁w", "▁wo", "▁wor", "▁worl", "▁world", "or", "ld", "▁▁", "i", "▁hi"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + normal + ["<|user|>", "<tool>"]
    types = [2, 3, 3] + [6] * 256 + [1] * len(normal) + [3, 4]
    # longer pieces score higher, as in a trained SentencePiece model
    scores = [0.0] * 259 + [-10.0 + len(t) for t in normal] + [0.0, 0.0]
    scores[tokens.index("▁▁")] = -9.5  # below '▁h', so ' hello' becomes '▁' + '▁hello'
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}
    meta.update(over)
    return meta


@pytest.fixture(scope="module")
def spm():
    return Tokenizer.from_gguf_metadata(_spm_meta())


def _id(tok, piece):
    return tok._tokens.index(piece)


def test_spm_encode(spm):
    assert spm.add_bos and spm.bos_token_id == 1 and spm.eos_token_id == 2
    hello, world = _id(spm, "▁hello"), _id(spm, "▁world")
    assert spm.encode("hello world") == [1, hello, world]
    assert spm.encode("hello world", add_special_tokens=False) == [hello, world]
    # the highest-scoring pair merges first: '▁h' (-8) beats '▁▁' (-9.5)
    assert spm.encode(" hello", add_special_tokens=False) == [_id(spm, "▁"), hello]
    assert spm.encode("  ", add_special_tokens=False) == [_id(spm, "▁▁"), _id(spm, "▁")]


def test_spm_byte_fallback(spm):
    ids = spm.encode("hé", add_special_tokens=False)
    assert ids == [_id(spm, "▁h"), _id(spm, "<0xC3>"), _id(spm, "<0xA9>")]
    assert spm.decode(ids) == "hé"
    assert spm.token_bytes(_id(spm, "<0xC3>")) == b"\xc3"


def test_spm_special_tokens_and_space_prefix(spm):
    # a space prefix also follows a special token, as in llama.cpp
    ids = spm.encode("<|user|>hi</s>", add_special_tokens=False)
    assert ids == [_id(spm, "<|user|>"), _id(spm, "▁hi"), 2]
    # user-defined tokens are parsed too and stay in skip_special_tokens output
    ids = spm.encode("<tool>hi", add_special_tokens=False)
    assert ids[0] == _id(spm, "<tool>")
    assert spm.decode(ids, skip_special_tokens=True) == "<tool> hi"


def test_spm_decode_leading_space(spm):
    ids = spm.encode("hello world")
    assert spm.decode(ids, skip_special_tokens=True) == "hello world"
    assert spm.decode(ids) == "<s> hello world"
    for text in ["hello world", " hello", "hello  world", "hé wo"]:
        assert spm.decode(spm.encode(text), skip_special_tokens=True) == text


def test_spm_incremental(spm):
    out = spm.encode("hello world", add_special_tokens=False)
    detok = IncrementalDetokenizer(spm)  # no prompt: stream from sequence start
    assert "".join(detok.push(i) for i in out) == spm.decode(out) == "hello world"
    prompt = spm.encode("hi")
    detok = IncrementalDetokenizer(spm, prompt_ids=prompt)  # mid-sequence: '▁' is a space
    text = "".join(detok.push(i) for i in out)
    assert text == " hello world"
    assert text == spm.decode(prompt + out, skip_special_tokens=True)[len(spm.decode(prompt, True)):]
    ids = spm.encode("é", add_special_tokens=False)
    assert ids == [_id(spm, "▁"), _id(spm, "<0xC3>"), _id(spm, "<0xA9>")]
    detok = IncrementalDetokenizer(spm, prompt_ids=prompt)
    assert [detok.push(i) for i in ids] == [" ", "", "é"]


def test_spm_options(spm):
    tok = Tokenizer.from_gguf_metadata(_spm_meta(**{"tokenizer.ggml.add_bos_token": False,
                                                   "tokenizer.ggml.add_space_prefix": False}))
    assert not tok.add_bos
    assert tok.encode("hello") == [_id(tok, "h"), _id(tok, "e"), _id(tok, "l"), _id(tok, "l"), _id(tok, "o")]
    assert tok.decode(tok.encode(" hello")) == " hello"
    # unknown characters without byte tokens fall back to <unk>
    meta = _spm_meta()
    keep = [i for i, t in enumerate(meta["tokenizer.ggml.tokens"]) if not t.startswith("<0x")]
    small = {k: ([v[i] for i in keep] if isinstance(v, list) else v) for k, v in meta.items()}
    tok = Tokenizer.from_gguf_metadata(small)
    assert tok.encode("hé", add_special_tokens=False) == [_id(tok, "▁h"), 0, 0]


# --- Hugging Face folders --------------------------------------------------------------------------
def _write_hf(tmp_path, config=None, gen=None):
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, pre_tokenizers, processors
    from pocketcupy.tokenizer_gguf import BYTE_ENCODER

    vocab = {BYTE_ENCODER[b]: b for b in range(256)}
    for i, t in enumerate(["Ġw", "or", "Ġwor", "ld", "Ġworld", "he", "ll", "hell", "hello"]):
        vocab[t] = 256 + i
    merges = [("Ġ", "w"), ("o", "r"), ("Ġw", "or"), ("l", "d"), ("Ġwor", "ld"), ("h", "e"), ("l", "l"),
              ("he", "ll"), ("hell", "o")]
    tk = HFTok(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(["<s>", "<|im_start|>", "<|im_end|>"])
    tk.add_tokens(["<tool>"])
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 265)])
    tk.save(str(tmp_path / "tokenizer.json"))
    cfg = {"bos_token": {"content": "<s>", "__type": "AddedToken"}, "eos_token": "<|im_end|>",
           "chat_template": "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"}
    cfg.update(config or {})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    if gen is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    return tmp_path


def test_hf_dir(tmp_path):
    tok = Tokenizer.from_hf_dir(str(_write_hf(tmp_path, gen={"eos_token_id": [267, 265]})))
    assert tok.vocab_size == 269
    assert tok.bos_token_id == 265 and tok.eos_token_id == 267
    assert tok.eos_token_ids == {265, 267}
    assert tok.add_bos  # detected from the post-processor
    assert tok.encode("hello world") == [265, 264, 260]
    assert tok.encode("hello world", add_special_tokens=False) == [264, 260]
    ids = tok.encode("<|im_start|>hello<tool>é<|im_end|>", add_special_tokens=False)
    assert ids[0] == 266 and ids[-1] == 267 and 268 in ids
    assert tok.decode(ids) == "<|im_start|>hello<tool>é<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "hello<tool>é"
    assert {265, 266, 267, 268} <= tok.special_token_ids
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "[user]x"
    detok = IncrementalDetokenizer(tok, prompt_ids=[265])
    assert "".join(detok.push(i) for i in tok.encode("é world", False)) == "é world"


def test_eos_appended_where_the_tokenizer_says(tmp_path):
    """Embedding models' tokenizers end every text with EOS (or <|endoftext|>), which their last-token
    pooling reads: GGUF's tokenizer.ggml.add_eos_token, a Hugging Face post-processor's suffix, or
    tokenizer_config's add_eos_token. Never with add_special_tokens=False (chat templates)."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import processors

    gguf = Tokenizer.from_gguf_metadata(_spm_meta(**{"tokenizer.ggml.add_eos_token": True}))
    assert gguf.encode("hello")[-1] == gguf.eos_token_id == 2 and gguf.encode("hello")[0] == 1
    assert gguf.eos_token_id not in gguf.encode("hello", add_special_tokens=False)
    folder = _write_hf(tmp_path)
    tk = HFTok.from_file(str(folder / "tokenizer.json"))
    tk.post_processor = processors.TemplateProcessing(single="<s> $A <|im_start|>",
                                                      special_tokens=[("<s>", 265), ("<|im_start|>", 266)])
    tk.save(str(folder / "tokenizer.json"))
    tok = Tokenizer.from_hf_dir(str(folder))
    assert tok.encode("hello world") == [265, 264, 260, 266] and tok.encode("hello world", False) == [264, 260]
    _write_hf(tmp_path, config={"add_eos_token": True})     # the config decides: its eos_token, <|im_end|>
    assert Tokenizer.from_hf_dir(str(tmp_path)).encode("hello world") == [265, 264, 260, 267]


def test_hf_dir_config_overrides(tmp_path):
    tok = Tokenizer.from_hf_dir(str(_write_hf(tmp_path, config={"add_bos_token": False, "chat_template": None})))
    assert not tok.add_bos and tok.chat_template is None
    assert tok.eos_token_ids == {267}
    (tmp_path / "chat_template.jinja").write_text("T")
    assert Tokenizer.from_hf_dir(str(tmp_path)).chat_template == "T"


def test_hf_dir_errors(tmp_path):
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.from_hf_dir(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError):
        Tokenizer.from_hf_dir(str(tmp_path))


def test_hf_fixture_folder():
    path = os.path.join(FIXTURES, "hf_tokenize.json")
    folder = os.path.join(FIXTURES, "tiny_llama")
    if not (os.path.exists(path) and os.path.isdir(folder)):
        pytest.skip("tests/fixtures/hf_tokenize.json / tiny_llama not present")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    tok = Tokenizer.from_hf_dir(folder)
    for case in data["cases"]:
        assert tok.encode(case["text"], add_special_tokens=False) == case["ids"], case["text"]
        assert tok.decode(case["ids"]) == case["text"]
    for case in data.get("chat", []):
        rendered = tok.apply_chat_template(case["messages"], add_generation_prompt=case["add_generation_prompt"])
        assert rendered == case["rendered"]
        assert tok.encode(rendered, add_special_tokens=False) == case["ids"]
