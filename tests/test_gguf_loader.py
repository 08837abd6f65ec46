import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from pocketcupy.loader import load_checkpoint
from pocketcupy.loader.gguf import GGML_TYPES, SUPPORTED_TYPES, read_gguf, read_metadata
from pocketcupy.quant.qtensor import QTensor

QT = gguf.GGMLQuantizationType


def _write(path, arch="llama", tensors=(), kv=None):
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in (kv or {}).items():
        if isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_string(k, v)
    for name, arr, qtype in tensors:
        if qtype is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_smollm2_config(smollm2_gguf):
    ck = load_checkpoint(smollm2_gguf)
    c = ck.config
    assert (c.architecture, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads) == ("llama", 30, 576, 9, 3)
    assert (c.head_dim, c.intermediate_size, c.vocab_size) == (64, 1536, 49152)
    assert c.rope_theta == 100000.0 and c.rope_interleaved and c.tie_word_embeddings
    assert c.max_position == 8192 and abs(c.rms_eps - 1e-5) < 1e-9
    emb = ck.tensors["token_embd.weight"]
    assert emb.qtype == "Q8_0" and emb.shape == (49152, 576) and emb.data.shape == (49152, 612)
    assert ck.tensors["blk.0.ffn_down.weight"].qtype == "Q4_1"


def test_metadata_values(smollm2_gguf):
    meta = read_metadata(smollm2_gguf)
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert len(meta["tokenizer.ggml.tokens"]) == 49152
    assert meta["tokenizer.ggml.tokens"][1] == "<|im_start|>"
    assert "im_start" in meta["tokenizer.chat_template"]


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_quantized_round_trip(tmp_path, qtype):
    """Our reader plus dequantizer recovers weights quantized by the gguf package."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    q = gguf.quants.quantize(w, QT[qtype])
    path = tmp_path / "m.gguf"
    _write(path, tensors=[("w", q, QT[qtype]), ("f", w, None)])
    _, tensors = read_gguf(str(path))
    assert tensors["w"].qtype == qtype and tensors["w"].shape == (8, 64)
    np.testing.assert_array_equal(tensors["f"].dequantize(), w)
    err = np.abs(tensors["w"].dequantize() - w).max()
    assert err < {"Q8_0": 0.03, "Q5_0": 0.15, "Q5_1": 0.15}.get(qtype, 0.35)


@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES - {"F32", "F16", "BF16"}))
def test_every_block_type_reads_and_dequantizes(tmp_path, qtype):
    type_id = next(i for i, (n, _, _) in GGML_TYPES.items() if n == qtype)
    _, block, nbytes = GGML_TYPES[type_id]
    rows, cols = 3, 512
    raw = np.random.default_rng(1).integers(0, 256, (rows, cols // block * nbytes), dtype=np.uint8)
    path = tmp_path / "m.gguf"
    _write(path, tensors=[("w", raw, QT[qtype])])
    _, tensors = read_gguf(str(path))
    t = tensors["w"]
    assert t.shape == (rows, cols) and t.data.shape == raw.shape
    np.testing.assert_array_equal(t.data, raw)
    with np.errstate(all="ignore"):  # random bytes make some fp16 scales inf/nan
        assert t.dequantize().shape == (rows, cols)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_fast_dequantizers_match_the_gguf_package_bit_for_bit(qtype):
    """gguf_dequant.py's whole-tensor dequantizers against the package's reference ones, over random
    blocks (inf / nan / subnormal float16 scales among them): the same float32 bits."""
    from pocketcupy.quant.gguf_dequant import dequantize_fast

    _, block, nbytes = next(v for v in GGML_TYPES.values() if v[0] == qtype)
    raw = np.random.default_rng(2).integers(0, 256, (40, 8 * nbytes), dtype=np.uint8)
    with np.errstate(all="ignore"):
        ref = gguf.quants.dequantize(raw, QT[qtype]).reshape(40, 8 * block)
        got = dequantize_fast(raw, qtype, (40, 8 * block))
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_iq4_nl_values_are_the_non_linear_table_times_d(tmp_path):
    """IQ4_NL (no quantizer in the gguf package) against its definition in ggml: a block of 32 is an
    fp16 d and 16 bytes, value j the table entry of byte j's low nibble times d, value j + 16 its
    high nibble's."""
    from .gguf_blocks import random_blocks

    table = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
    raw = random_blocks(np.random.default_rng(3), "IQ4_NL", 2, 64, use_quantizer=False)
    path = tmp_path / "m.gguf"
    _write(path, tensors=[("w", raw, QT.IQ4_NL)])
    _, tensors = read_gguf(str(path))
    blocks = raw.reshape(-1, 18)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 2:]
    want = np.concatenate([table[qs & 0xF], table[qs >> 4]], axis=1) * d
    np.testing.assert_array_equal(tensors["w"].dequantize(), want.reshape(2, 64))


def test_bf16_and_f16(tmp_path):
    w = np.random.default_rng(2).standard_normal((4, 32)).astype(np.float32)
    bits = (w.view(np.uint32) >> 16).astype(np.uint16)
    path = tmp_path / "m.gguf"
    _write(path, tensors=[("b", bits, QT.BF16), ("h", w.astype(np.float16), None)])
    _, t = read_gguf(str(path))
    assert t["b"].qtype == "BF16" and t["h"].qtype == "F16"
    np.testing.assert_array_equal(t["b"].dequantize(), (bits.astype(np.uint32) << 16).view(np.float32))
    np.testing.assert_array_equal(t["h"].dequantize(), w.astype(np.float16).astype(np.float32))


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="model"):
        load_checkpoint(str(tmp_path / "nope.gguf"))


def test_not_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"NOPE" + b"\0" * 100)
    with pytest.raises(ValueError, match="not a GGUF"):
        read_gguf(str(p))


@pytest.mark.parametrize("keep", [30, 2000, 0.999])
def test_truncated(tmp_path, smollm2_gguf, keep):
    size = os.path.getsize(smollm2_gguf)
    n = int(size * keep) if isinstance(keep, float) else keep
    p = tmp_path / "cut.gguf"
    with open(smollm2_gguf, "rb") as f:
        p.write_bytes(f.read(n))
    with pytest.raises(ValueError, match="truncated"):
        load_checkpoint(str(p))


def test_unsupported_architecture(tmp_path):
    p = tmp_path / "m.gguf"
    _write(p, arch="mamba", tensors=[("w", np.zeros((2, 32), np.float32), None)])
    with pytest.raises(ValueError, match="mamba"):
        load_checkpoint(str(p))


@pytest.mark.parametrize("qtype, row_bytes", [("Q8_K", 292),   # llama.cpp's activation type: 256 values, 292 bytes
                                              ("TQ2_0", 66)])  # a type we do not list: was "unknown GGML type id 35"
def test_unsupported_tensor_type(tmp_path, qtype, row_bytes):
    p = tmp_path / "m.gguf"
    _write(p, tensors=[("w", np.zeros((2, row_bytes), np.uint8), QT[qtype])])
    with pytest.raises(ValueError, match=f"tensor 'w' has unsupported GGUF type {qtype} \\(supported: ") as e:
        read_gguf(str(p))
    assert str(p) in str(e.value)


def _write_raw(path, infos, alignment=None):
    """A GGUF written byte by byte (GGUFWriter refuses the damage): infos are (name, dims, type id);
    each tensor's data is zeros at offset 0; alignment: general.alignment, or a list of values
    each written as the key again."""
    import struct

    def s(x):
        return struct.pack("<Q", len(x.encode())) + x.encode()

    kv = [(s("general.architecture") + struct.pack("<I", 8) + s("llama"))]
    for value in [] if alignment is None else alignment if isinstance(alignment, list) else [alignment]:
        kv.append(s("general.alignment") + struct.pack("<II", 4, value))
    out = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(kv)) + b"".join(kv)
    for name, dims, type_id in infos:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", type_id, 0)
    path.write_bytes(out + b"\0" * (-len(out) % 32 + 4096))


@pytest.mark.parametrize("infos, alignment, match", [
    ([("w", [], 0)], None, "'w' has 0 dimensions"),            # was an IndexError
    ([("w", [2] * 5, 0)], None, "'w' has 5 dimensions"),
    ([("w", [32], 0), ("w", [32], 0)], None, "'w' appears twice"),  # the second silently won
    ([("w", [32], 0)], 0, "alignment 0 is not a power of 2"),  # was a ZeroDivisionError
    ([("w", [32], 0)], 24, "alignment 24 is not a power of 2"),  # read the data from the wrong offset
    ([("w", [32], 0)], [32, 64], "metadata key 'general.alignment' appears twice"),  # the second silently won
])
def test_malformed_tensor_infos(tmp_path, infos, alignment, match):
    p = tmp_path / "m.gguf"
    _write_raw(p, infos, alignment)
    with pytest.raises(ValueError, match=match) as e:
        read_gguf(str(p))
    assert str(p) in str(e.value)


_LLAMA_KV = {"llama.context_length": 64, "llama.embedding_length": 32, "llama.block_count": 1,
             "llama.feed_forward_length": 64, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2}


@pytest.mark.parametrize("change, match", [
    ({"llama.context_length": None}, "lacks llama.context_length"),    # was silently 4096
    ({"llama.attention.head_count": 0}, "head_count must be a positive integer, got 0"),    # ZeroDivisionError
    ({"llama.attention.head_count_kv": 0}, "head_count_kv must be a positive integer"),    # ZeroDivisionError
    ({"llama.attention.head_count": "4"}, "head_count must be a positive integer, got '4'"),
    ({"llama.rope.dimension_count": 12}, "rope dimension 12 must be even and at most the head dimension 8"),
    ({"llama.rope.freq_base": 0.0}, "rope_theta must be positive"),      # NaN logits
    ({"llama.attention.layer_norm_rms_epsilon": -1.0}, "rms_eps"),      # NaN logits
    ({"llama.rope.scaling.type": "yarn"}, "unsupported rope scaling type 'yarn'"),
])
def test_bad_model_metadata(tmp_path, change, match):
    kv = {k: v for k, v in {**_LLAMA_KV, **change}.items() if v is not None}
    p = tmp_path / "m.gguf"
    _write(p, tensors=[("token_embd.weight", np.zeros((16, 32), np.float32), None)], kv=kv)
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(str(p))
    assert str(p) in str(e.value)


@pytest.mark.parametrize("name, shape, match", [
    ("blk.0.attn_k.weight", (32, 32), r"'blk.0.attn_k.weight' has shape \(32, 32\), but the config needs \(16, 32\)"),
    ("token_embd.weight", (16, 48), r"'token_embd.weight' has shape \(16, 48\), but the config needs \(16, 32\)"),
    ("blk.1.ffn_norm.weight", (32,), "belongs to layer 1, but the config has 1 layers"),   # silently unused
])
def test_weight_shapes_checked_against_metadata(tmp_path, name, shape, match):
    """A weight that does not fit the metadata was a reshape error in the first forward."""
    p = tmp_path / "m.gguf"
    tensors = {"token_embd.weight": np.zeros((16, 32), np.float32), name: np.zeros(shape, np.float32)}
    _write(p, tensors=[(k, v, None) for k, v in tensors.items()], kv=_LLAMA_KV)
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(str(p))
    assert str(p) in str(e.value)


@pytest.mark.parametrize("kv, match", [
    ({}, r"no tokenizer \(tokenizer.ggml.model\)"),             # was "unsupported tokenizer model None"
    ({"tokenizer.ggml.model": "gpt2"}, "no tokenizer.ggml.tokens"),
])
def test_missing_tokenizer_names_the_file(tmp_path, kv, match):
    from pocketcupy.tokenizer import Tokenizer

    p = tmp_path / "m.gguf"
    _write(p, tensors=[("token_embd.weight", np.zeros((16, 32), np.float32), None)], kv={**_LLAMA_KV, **kv})
    with pytest.raises(ValueError, match=match) as e:
        Tokenizer.from_checkpoint(load_checkpoint(str(p)))
    assert str(p) in str(e.value)


def test_qtensor_dense_flag():
    assert QTensor("F32", (2,), np.zeros(2, np.float32)).is_dense
    assert not QTensor("Q8_0", (1, 32), np.zeros((1, 34), np.uint8)).is_dense
