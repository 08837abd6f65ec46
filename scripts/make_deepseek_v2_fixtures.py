"""What transformers' DeepseekV2ForCausalLM computes for the tiny DeepSeek-V2 checkpoints
(tests/deepseek_checkpoints.py's V2_VARIANTS), in the layout and the conditions of
scripts/make_deepseek_fixtures.py (same venv):

    /tmp/hfvenv/bin/python scripts/make_deepseek_v2_fixtures.py [--out tests/fixtures/deepseek_v2_logits.npz]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from seeded_reference import main  # noqa: E402  (it puts the repository on sys.path)
from tests import deepseek_v2_checkpoints  # noqa: E402

if __name__ == "__main__":
    main(__doc__, deepseek_v2_checkpoints)
