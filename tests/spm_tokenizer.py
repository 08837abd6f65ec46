"""A real SentencePiece tokenizer for tests: a BPE model with byte fallback that the `sentencepiece`
library trains (in well under a second) on the fixed text below, with Llama's trainer settings
(unk/bos/eos = 0/1/2, a dummy prefix space, whitespace kept, digits split), written as GGUF "llama"
tokenizer keys as llama.cpp's convert_hf_to_gguf.py does (pieces, scores, token types), and a tiny
random-weight GGUF model that carries it (scripts/make_synthetic_model.py)."""
import os

VOCAB = 400
CORPUS = """The engine reads the prompt and turns the text into tokens.
Each token is a piece of the text, and the model sees the tokens in a batch.
The batch holds the tokens of every running request, and the server adds new requests to the batch.
Reading, writing and sampling: the engine is running the model on the batch again and again.
A token that starts a word carries the space before it, and the decoder turns it back into a space.
The sampler picks the next token from the logits, and the logprobs tell how likely each token was.
Streaming sends the tokens as they are made; the client joins the strings and gets the text.
Tokens, batches, requests and servers: all of them are counted, logged and tested.
The cache keeps the keys and the values of the tokens, so the model does not compute them again.
When the batch is full, the scheduler waits; when a request ends, its blocks are freed.
The tokenizer splits rare characters into bytes, and the bytes come together as the text again.
Numbers such as 12, 345 and 6789 are split into single digits by the tokenizer.
Testing the server: start it, send the requests, read the answers, and stop it.
Everything the engine does is logged: loading, tokenizing, batching, sampling and streaming.
"""
# a prompt's text is all the template writes: the model only needs one
TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def train() -> bytes:
    """The serialized SentencePiece model (the same bytes on every run: one thread)."""
    import io

    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()), model_writer=buf, vocab_size=VOCAB, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, add_dummy_prefix=True, remove_extra_whitespaces=False,
        split_digits=True, normalization_rule_name="identity", allow_whitespace_only_pieces=True, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, num_threads=1, minloglevel=2)
    return buf.getvalue()


def gguf_keys(proto: bytes) -> dict:
    """GGUF tokenizer.* keys of the model, with types as llama.cpp's converter sets them."""
    import sentencepiece as spm

    from pocketcupy.tokenizer_gguf import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED

    sp = spm.SentencePieceProcessor(model_proto=proto)
    types = []
    for i in range(sp.get_piece_size()):
        kind = ((sp.is_unknown(i), UNKNOWN), (sp.is_control(i), CONTROL), (sp.is_unused(i), UNUSED),
                (sp.is_byte(i), BYTE))
        types.append(next((t for hit, t in kind if hit), NORMAL))
    return {"tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(sp.get_piece_size())],
            "tokenizer.ggml.scores": [sp.get_score(i) for i in range(sp.get_piece_size())],
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": sp.bos_id(),
            "tokenizer.ggml.eos_token_id": sp.eos_id(), "tokenizer.ggml.unknown_token_id": sp.unk_id(),
            "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": True,
            "tokenizer.chat_template": TEMPLATE}


def write_vocab_gguf(path: str, keys: dict) -> str:
    """A GGUF file holding only the tokenizer (as llama.cpp's vocab-only files)."""
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model(keys["tokenizer.ggml.model"])
    w.add_token_list(keys["tokenizer.ggml.tokens"])
    w.add_token_scores(keys["tokenizer.ggml.scores"])
    w.add_token_types(keys["tokenizer.ggml.token_type"])
    w.add_bos_token_id(keys["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(keys["tokenizer.ggml.eos_token_id"])
    w.add_unk_token_id(keys["tokenizer.ggml.unknown_token_id"])
    w.add_add_bos_token(keys["tokenizer.ggml.add_bos_token"])
    w.add_add_space_prefix(keys["tokenizer.ggml.add_space_prefix"])
    w.add_chat_template(keys["tokenizer.chat_template"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make_model(out: str) -> str:
    """A tiny random-weight Llama GGUF (Q8_0) with the SentencePiece tokenizer; returns its path."""
    from tests.helpers import load_script

    vocab = write_vocab_gguf(os.path.join(out, "vocab.gguf"), gguf_keys(train()))
    synth = load_script("make_synthetic_model")
    spec = synth.Spec(vocab=VOCAB, hidden=64, layers=1, heads=2, kv_heads=1, intermediate=128, context=512, seed=7)
    result = synth.make_model(os.path.join(out, "model"), spec, ["q8_0"], threads=1, check_disk=False,
                              tokenizer_gguf=vocab)
    return result["formats"]["q8_0"]["path"]
