"""A random-weight Qwen3.5 dense checkpoint (Gated DeltaNet + gated attention hybrid, bf16) in the
Hugging Face layout, for benchmarks on the CUDA backend (generated where it runs; ~1.7B parameters,
3.4 GB by default). The layout and the weights' scales are those of the tiny test checkpoints
(tests/qwen3_next_checkpoints.py), at a real model's widths: hidden 2048, 24 layers (every 4th full
attention, 8 heads of 256, 2 KV heads, rope on a quarter of each head), DeltaNet 16 key / 32 value
heads of 128, MLP 6144, vocab 49,152. Prints the folder.

    python scripts/make_synthetic_qwen35.py --out DIR [--layers 24] [--hidden 2048]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests import qwen3_next_checkpoints as checkpoints  # noqa: E402


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--vocab", type=int, default=49152)
    a = ap.parse_args(argv)
    if a.layers % 4 or a.layers < 4:
        ap.error("--layers must be a positive multiple of 4 (every 4th layer is full attention)")
    rope = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10], "mrope_interleaved": True}
    changes = dict(checkpoints.VARIANTS["q35_dense"][2], hidden_size=a.hidden, num_hidden_layers=a.layers,
                   full_attention_interval=4, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                   linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                   linear_value_head_dim=128, intermediate_size=a.intermediate, vocab_size=a.vocab,
                   max_position_embeddings=8192, rope_parameters=rope)
    checkpoints.VARIANTS["q35_bench"] = (7, "BF16", changes)
    folder = checkpoints.write_checkpoint(a.out, "q35_bench")
    print(folder)
    return folder


if __name__ == "__main__":
    main()
