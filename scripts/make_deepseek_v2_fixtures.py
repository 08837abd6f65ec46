"""What transformers' DeepseekV2ForCausalLM computes for the tiny DeepSeek-V2 checkpoints of
tests/deepseek_checkpoints.py (V2_VARIANTS, written from a NumPy seed; the weights are not committed).

Needs (NOT project dependencies; only for regenerating the fixture), e.g. in a throwaway venv:

    python -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch transformers numpy     # the CPU build of torch is enough
    /tmp/hfvenv/bin/python scripts/make_deepseek_v2_fixtures.py [--out tests/fixtures/deepseek_v2_logits.npz]

For each variant: the sha256 of the model.safetensors it was made from, float32 logits (eager
attention, CPU, 1 thread; the stored weights upcast exactly) at every position of PROMPTS[0] and
PROMPTS[1] and at the last of PROMPTS[2], and the 16 greedy tokens after GREEDY_PROMPT (checked
against a cache-free argmax loop). Deterministic: rerunning writes a byte-identical file.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from seeded_reference import main  # noqa: E402  (it puts the repository on sys.path)
from tests import deepseek_v2_checkpoints  # noqa: E402

if __name__ == "__main__":
    main(__doc__, deepseek_v2_checkpoints)
