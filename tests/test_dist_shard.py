"""Tensor-parallel sharding on the CPU: every weight type's shards reassemble to the original,
column shards fall on quantization blocks (or are refused), the layout rules, and a rank's shard
of a GGUF file is cut from the memory map without reading the rest."""
import dataclasses

import numpy as np
import pytest

from pocketcupy.config import GatedDeltaNetConfig, ModelConfig
from pocketcupy.dist.layout import ShardLayout
from pocketcupy.dist.shard import BLOCKS, check_shardable, pad_rows, shard_tensor, split_kind, take_cols, take_rows
from pocketcupy.loader import load_checkpoint
from pocketcupy.loader.gguf import SUPPORTED_TYPES
from pocketcupy.models.llama import TP_SPLITS
from pocketcupy.quant.qtensor import QTensor
from pocketcupy.quant.quantize import quantize_tensor

from .gguf_blocks import random_blocks

QUANTIZER_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"}


def make_tensor(qtype: str, rows: int, cols: int, seed: int = 0) -> QTensor:
    """Real blocks: our quantizers where they exist, valid random blocks for the other types."""
    rng = np.random.default_rng(seed)
    if qtype in QUANTIZER_TYPES:
        return quantize_tensor(rng.standard_normal((rows, cols), dtype=np.float32), qtype)
    return QTensor(qtype, (rows, cols), random_blocks(rng, qtype, rows, cols, use_quantizer=False))


@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES))
@pytest.mark.parametrize("world", [2, 3, 4])
def test_shards_reassemble(qtype, world):
    per_block = BLOCKS[qtype][0]
    cols = 256 * world * (1 if per_block == 256 else 2) if per_block > 1 else 12 * world
    t = make_tensor(qtype, 6 * world, cols)
    full = t.dequantize()
    row_parts = [take_rows(t, r * 6, (r + 1) * 6) for r in range(world)]
    col_w = cols // world
    col_parts = [take_cols(t, r * col_w, (r + 1) * col_w) for r in range(world)]
    assert np.array_equal(np.concatenate([p.data for p in row_parts]), t.data)
    assert np.array_equal(np.concatenate([p.data for p in col_parts], axis=1), t.data)
    assert np.array_equal(np.concatenate([p.dequantize() for p in row_parts]), full)
    assert np.array_equal(np.concatenate([p.dequantize() for p in col_parts], axis=1), full)
    assert all(p.shape == (6 * world, col_w) and p.data.flags.c_contiguous for p in col_parts)


def _fp8(rng, rows, cols):
    return QTensor("FP8", (rows, cols), rng.integers(0, 0x7F, (rows, cols), dtype=np.uint8),
                   rng.uniform(0.5, 2.0, (rows, cols // 128)).astype(np.float32))


def _nvfp4(rng, rows, cols):
    return QTensor("NVFP4", (rows, cols), rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8),
                   rng.integers(0x20, 0x60, (rows, cols // 16), dtype=np.uint8), 0.37)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("make", [_fp8, _nvfp4], ids=["FP8", "NVFP4"])
def test_code_shards_carry_their_scales(world, make):
    """FP8 / NVFP4 codes are cut with their scales (a scale per row and 128 / 16 columns; NVFP4's
    tensor scale kept): rows anywhere, columns on the scales' groups (elsewhere the columns as BF16);
    padded rows are zero."""
    rng = np.random.default_rng(world)
    rows, cols = 5 * world, 256 * world
    t = make(rng, rows, cols)
    full = t.dequantize()
    rows_w, col_w = rows // world, cols // world
    assert np.array_equal(np.concatenate([take_rows(t, r * rows_w, (r + 1) * rows_w).dequantize()
                                          for r in range(world)]), full)
    assert np.array_equal(np.concatenate([take_cols(t, r * col_w, (r + 1) * col_w).dequantize()
                                          for r in range(world)], axis=1), full)
    padded = pad_rows(t, rows + 3).dequantize()
    assert np.array_equal(padded[:rows], full) and not padded[rows:].any()
    assert all(take_cols(t, r * col_w, (r + 1) * col_w).qtype == t.qtype for r in range(world))
    off = take_cols(t, 64, 192) if t.qtype == "FP8" else take_cols(t, 8, 40)
    want = full[:, 64:192] if t.qtype == "FP8" else full[:, 8:40]
    assert off.qtype == "BF16" and np.array_equal(off.dequantize(), want)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "IQ4_XS", "BF16"])
def test_padded_vocab_rows_are_zero(qtype):
    t = make_tensor(qtype, 5, 256)
    p = pad_rows(t, 8)
    assert p.shape == (8, 256)
    out = p.dequantize()
    assert np.array_equal(out[:5], t.dequantize()) and not out[5:].any()


def test_column_split_off_a_block_boundary_is_refused():
    t = make_tensor("Q4_K", 4, 512)
    with pytest.raises(ValueError, match=r"tensor_parallel_size: blk.0.ffn_down.weight \(Q4_K, 256-value blocks\)"):
        take_cols(t, 128, 256, "blk.0.ffn_down.weight")
    q8 = make_tensor("Q8_0", 4, 96)
    assert take_cols(q8, 32, 64).dequantize().shape == (4, 32)
    with pytest.raises(ValueError, match="Q8_0, 32-value blocks"):
        take_cols(q8, 0, 48)


def llama_config(heads=8, kv=4, hidden=512, inter=1024, vocab=1000, head_dim=64):
    return ModelConfig("llama", vocab, hidden, 2, heads, kv, head_dim, inter)


def test_layout_splits_heads_by_kv_group():
    smol = llama_config(heads=9, kv=3, hidden=576, inter=1536, vocab=49152)
    two = [ShardLayout.of(smol, r, 2) for r in range(2)]
    assert [(x.q_heads, x.kv_heads) for x in two] == [((0, 6), (0, 2)), ((6, 9), (2, 3))]
    three = [ShardLayout.of(smol, r, 3) for r in range(3)]
    assert [(x.q_heads, x.kv_heads, x.intermediate_size) for x in three] == \
        [((0, 3), (0, 1), 512), ((3, 6), (1, 2), 512), ((6, 9), (2, 3), 512)]
    # fewer KV heads than ranks: each KV head replicated, its query heads shared out
    four = [ShardLayout.of(llama_config(heads=8, kv=2), r, 4) for r in range(4)]
    assert [(x.q_heads, x.kv_heads) for x in four] == [((0, 2), (0, 1)), ((2, 4), (0, 1)), ((4, 6), (1, 2)),
                                                        ((6, 8), (1, 2))]
    # vocabulary: equal shards, the last one padded
    lay = [ShardLayout.of(llama_config(vocab=1001), r, 2) for r in range(2)]
    assert [x.span("vocab_rows") for x in lay] == [(0, 0, 501), (0, 501, 1001)] and lay[1].vocab_shard == 501


@pytest.mark.parametrize("cfg,world,match", [
    (dict(heads=9, kv=3, inter=1536), 6, "6 ranks cannot share the model's 3 KV heads"),
    (dict(heads=8, kv=2), 3, "3 ranks cannot share the model's 2 KV heads"),
    (dict(heads=8, kv=4, inter=1000), 3, "3 does not divide the model's MLP size 1000"),
    (dict(), 0, "must be a positive integer"),
])
def test_layout_refuses(cfg, world, match):
    with pytest.raises(ValueError, match="tensor_parallel_size: " + match):
        ShardLayout.of(llama_config(**cfg), 0, world)


def test_check_shardable_names_the_weight():
    """Q4_K attention output of 4 heads x 64 split in two: 128 columns per rank, not a 256 block."""
    cfg = llama_config(heads=4, kv=2, hidden=256, inter=512, vocab=64, head_dim=64)
    tensors = {"blk.0.attn_output.weight": make_tensor("Q4_K", 256, 256),
               "blk.0.ffn_down.weight": make_tensor("Q4_K", 256, 512)}
    check_shardable({"blk.0.ffn_down.weight": tensors["blk.0.ffn_down.weight"]}, TP_SPLITS, ShardLayout.of(cfg, 1, 2))
    with pytest.raises(ValueError, match="blk.0.attn_output.weight .Q4_K, 256-value blocks. cannot be split"):
        check_shardable(tensors, TP_SPLITS, ShardLayout.of(cfg, 0, 2))


def test_rank_shards_of_a_gguf_are_cut_from_the_memory_map(smollm2_gguf):
    ck = load_checkpoint(smollm2_gguf)
    lay = ShardLayout.of(ck.config, 1, 3)
    t = ck.tensors["blk.0.attn_q.weight"]
    part = shard_tensor(t, "q_rows", lay, "blk.0.attn_q.weight")
    assert np.shares_memory(part.data, t.data) and part.shape == (3 * 64, 576)  # a view: no copy
    assert np.array_equal(part.dequantize(), t.dequantize()[192:384])
    down = ck.tensors["blk.0.ffn_down.weight"]
    cols = shard_tensor(down, "ffn_cols", lay, "blk.0.ffn_down.weight")
    assert not np.shares_memory(cols.data, down.data) and cols.data.nbytes * 3 == down.data.nbytes
    assert np.array_equal(cols.dequantize(), down.dequantize()[:, 512:1024])
    embd = shard_tensor(ck.tensors["token_embd.weight"], "vocab_rows", lay)
    assert embd.shape == (16384, 576) and np.shares_memory(embd.data, ck.tensors["token_embd.weight"].data)
    one = ShardLayout.of(ck.config)
    assert shard_tensor(down, "ffn_cols", one) is down                        # one rank: the tensor itself
    assert dataclasses.astuple(one)[3:5] == ((0, 9), (0, 3))


@pytest.mark.parametrize("tiled", [False, True], ids=["grouped", "tiled"])
def test_deltanet_shards_by_key_head(tiled):
    """A Gated DeltaNet of 4 key heads of 16, 2 value heads of 32 each, over 2 ranks: each rank's q,
    k and v rows of [q; k; v], and out_proj's value columns; in llama.cpp's tiled head order (value
    head j of key head k at head j * 4 + k) one piece a value head of a key head, joined as Q8_0
    blocks."""
    gdn = GatedDeltaNetConfig(("linear_attention", "full_attention"), 4, 16, 32, 4, 8, out_proj_tiled=tiled)
    cfg = dataclasses.replace(llama_config(), gdn=gdn)
    qkv, out = make_tensor("Q4_K", 2 * 64 + 256, 256), make_tensor("Q8_0", 16, 256, seed=1)
    full_qkv, full_out = qkv.dequantize(), out.dequantize()
    heads = full_out.reshape(16, 2, 4, 32) if tiled else full_out.reshape(16, 4, 2, 32).transpose(0, 2, 1, 3)
    for rank in range(2):
        lay = ShardLayout.of(cfg, rank, 2)
        assert lay.deltanet.key_heads == (2 * rank, 2 * rank + 2) and lay.deltanet.conv_dim == 192
        part = shard_tensor(qkv, "gdn_qkv_rows", lay)
        rows = np.r_[32 * rank:32 * rank + 32, 64 + 32 * rank:96 + 32 * rank, 128 + 128 * rank:256 + 128 * rank]
        assert part.qtype == "Q4_K" and np.array_equal(part.dequantize(), full_qkv[rows])
        part = shard_tensor(out, "gdn_out_cols", lay, "blk.0.ssm_out.weight")
        want = heads[:, :, 2 * rank:2 * rank + 2]        # [row, value head of a key head, key head, value dim]
        if not tiled:
            want = want.transpose(0, 2, 1, 3)
        assert part.qtype == "Q8_0" and np.array_equal(part.dequantize(), want.reshape(16, 128))
    with pytest.raises(ValueError, match="tensor_parallel_size: 8 ranks cannot share the model's 4 linear-attention"):
        ShardLayout.of(cfg, 0, 8)


def test_split_kind_of_experts_and_row_parallel_biases():
    """A name's kind skips layer and expert numbers; a 1-D bias under a column split stays whole."""
    w, b = make_tensor("F32", 4, 8), make_tensor("F32", 1, 4)
    b = dataclasses.replace(b, shape=(4,), data=b.data[0])
    splits = {"attn_output": "q_cols", "ffn_down_exps": "cols", "ffn_up_exps": "rows"}
    assert split_kind("blk.1.attn_output.weight", w, splits) == "q_cols"
    assert split_kind("blk.1.attn_output.bias", b, splits) is None
    assert split_kind("blk.1.ffn_down_exps.7.weight", w, splits) == "cols"
    assert split_kind("blk.1.ffn_down_exps.7.bias", b, splits) is None
    assert split_kind("blk.1.ffn_up_exps.7.bias", b, splits) == "rows"
