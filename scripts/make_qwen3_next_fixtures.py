"""What transformers' Qwen3NextForCausalLM computes for the tiny Qwen3-Next checkpoints of
tests/qwen3_next_checkpoints.py, as scripts/make_deepseek_fixtures.py does for DeepSeek-V3 (see
there: what it needs, what it writes); torch, transformers and numpy in a throwaway venv:

    /tmp/hfvenv/bin/python scripts/make_qwen3_next_fixtures.py [--out tests/fixtures/qwen3_next_logits.npz]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from seeded_reference import main  # noqa: E402  (it puts the repository on sys.path)
from tests import qwen3_next_checkpoints  # noqa: E402

if __name__ == "__main__":
    main(__doc__, qwen3_next_checkpoints)
