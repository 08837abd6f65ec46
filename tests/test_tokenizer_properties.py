"""Property tests of tokenization against the reference behaviours (hypothesis, kept cheap): encode /
decode round trips on random Unicode (emoji, CJK, combining marks, chat markup); streaming
detokenization equal to the whole decode at every prefix (only an unfinished character's U+FFFD held
back, none left once it completes), after a prompt too; Hugging Face folders decode as `tokenizers`
does; stop strings found across any split of the text into deltas."""
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pocketcupy.stop import StopStringMatcher
from pocketcupy.tokenizer import IncrementalDetokenizer, Tokenizer
from pocketcupy.tokenizer_gguf import BYTE_ENCODER

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
PIECES = st.one_of(st.characters(blacklist_categories=("Cs",)),
                   st.sampled_from(list("aé😀👍🏽中한\u0301\u200d \n") + ["<|im_start|>", "<|im_end|>", "  ", "the"]))
TEXTS = st.lists(PIECES, max_size=16).map("".join)


@pytest.fixture(scope="module")
def toks(smollm2_gguf):
    """SmolLM2's GGUF tokenizer (bytes its vocabulary lacks: llama.cpp drops them) and a Hugging Face
    folder's with the `tokenizers` one it must decode as."""
    from tokenizers import Tokenizer as HFTokenizer

    smol = Tokenizer.from_gguf(smollm2_gguf)
    vocab = set(smol._tokens)
    missing = {b for b, c in BYTE_ENCODER.items() if c not in vocab}
    folder = os.path.join(FIXTURES, "tiny_qwen2")
    return smol, missing, Tokenizer.from_hf_dir(folder), HFTokenizer.from_file(os.path.join(folder, "tokenizer.json"))


def check_stream(tok, ids, skip, prompt=()):
    """Each prefix's stream is the prefix's decode up to its unfinished character's U+FFFD."""
    before = tok.decode(list(prompt), skip_special_tokens=skip)
    detok, text = IncrementalDetokenizer(tok, list(prompt), skip), ""
    for k, i in enumerate(ids):
        text += detok.push(i)
        full = tok.decode(list(prompt) + ids[:k + 1], skip_special_tokens=skip)[len(before):]
        assert full.startswith(text) and set(full[len(text):]) <= {"\ufffd"}, (k, text, full)
    assert text + detok.flush() == tok.decode(list(prompt) + ids, skip_special_tokens=skip)[len(before):]


@SETTINGS
@given(text=TEXTS, skip=st.booleans())
def test_round_trip_and_stream(toks, text, skip):
    smol, missing, hf, ref = toks
    for tok in (smol, hf):
        if tok is smol and any(b in missing for b in text.encode()):
            continue
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        check_stream(tok, ids, skip)
        check_stream(tok, ids, skip, prompt=tok.encode("Hi <|im_start|>", add_special_tokens=False))
    ids = ref.encode(text, add_special_tokens=False).ids
    assert hf.encode(text, add_special_tokens=False) == ids
    assert hf.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


def first_stop(text, stops, include):
    """The text up to the stop that completes first (the longest of those ending together)."""
    hits = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    end, start, s = min(hits)
    return text[:end if include else start], s


ALPHA = st.sampled_from(list("ab😀é"))


@SETTINGS
@given(text=st.lists(ALPHA, max_size=14).map("".join),
       stops=st.lists(st.lists(ALPHA, min_size=1, max_size=4).map("".join), min_size=1, max_size=3),
       include=st.booleans(), data=st.data())
def test_stop_strings_across_deltas(text, stops, include, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    deltas = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    m, out = StopStringMatcher(stops, include), ""
    for d in deltas:
        safe, hit = m.push(d)
        out += safe
        if hit:
            break
    else:
        out += m.flush()
    assert (out, m.matched) == first_stop(text, stops, include)
