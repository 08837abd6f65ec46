"""vLLM's bad_words: the token sequences a word becomes, and the tokens they forbid after an output."""
from pocketcupy.bad_words import bad_words_token_ids, banned_tokens
from pocketcupy.tokenizer import Tokenizer


def test_banned_tokens():
    seqs = ((7,), (3, 4, 5), (9, 4))
    assert banned_tokens(seqs, []) == [7]
    assert banned_tokens(seqs, [1, 3, 4]) == [7, 5]
    assert banned_tokens(seqs, [3, 9]) == [7, 4]
    assert banned_tokens(seqs, [4]) == [7]   # (3, 4) must both end the output


def test_bad_words_token_ids(smollm2_gguf):
    tok = Tokenizer.from_gguf(smollm2_gguf)
    seqs = bad_words_token_ids(tok, ["Paris", "  Paris", "hello world"])
    assert seqs == tuple(dict.fromkeys([tuple(tok.encode(t, add_special_tokens=False))
                                        for t in ("Paris", " Paris", "hello world", " hello world")]))
    assert all(len(s) >= 1 for s in seqs) and any(len(s) > 1 for s in seqs)
