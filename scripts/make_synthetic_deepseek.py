"""A random-weight DeepSeek-V3-architecture checkpoint (MLA + mixture of experts, bf16) in the Hugging
Face layout, for benchmarks on the CUDA backend (generated where it runs). The layout and the
weights' scales are those of the tiny test checkpoints (tests/deepseek_checkpoints.py), at
DeepSeek-V2-Lite's widths: hidden 2048, 16 heads, no q LoRA, kv_lora_rank 512, rope 64, nope 128,
values 128, the first layer dense (intermediate 10,944), then 64 routed experts of 1,408 (6 a token,
one group) and 2 shared, vocab 32,000; 8 layers by default (~4.3B parameters, 8.6 GB; the real
model has 27). No multi-token-prediction layer. Prints the folder.

    python scripts/make_synthetic_deepseek.py --out DIR [--layers 8] [--experts 64] [--hidden 2048]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests import deepseek_checkpoints as checkpoints  # noqa: E402


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    a = ap.parse_args(argv)
    if a.layers < 2 or a.experts < 6:
        ap.error("--layers must be at least 2 (the first is dense) and --experts at least 6 (6 a token)")
    changes = dict(checkpoints.VARIANTS["ds_plain"][2], hidden_size=a.hidden, num_hidden_layers=a.layers,
                   num_nextn_predict_layers=0, num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512,
                   qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, intermediate_size=10944,
                   moe_intermediate_size=1408, n_routed_experts=a.experts, n_shared_experts=2,
                   num_experts_per_tok=6, n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0,
                   vocab_size=a.vocab, tie_word_embeddings=False, max_position_embeddings=8192,
                   eos_token_id=a.vocab - 1, pad_token_id=a.vocab - 2)
    checkpoints.VARIANTS["ds_bench"] = (8, "BF16", changes)
    folder = checkpoints.write_checkpoint(a.out, "ds_bench")
    print(folder)
    return folder


if __name__ == "__main__":
    main()
