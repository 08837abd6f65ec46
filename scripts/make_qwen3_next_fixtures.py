"""What transformers' Qwen3NextForCausalLM computes for the tiny Qwen3-Next checkpoints of
tests/qwen3_next_checkpoints.py (written from a NumPy seed; the weights are not committed).

Needs (NOT project dependencies; only for regenerating the fixture), e.g. in a throwaway venv:

    python -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch transformers numpy     # the CPU build of torch is enough
    /tmp/hfvenv/bin/python scripts/make_qwen3_next_fixtures.py [--out tests/fixtures/qwen3_next_logits.npz]

For each variant: the sha256 of the model.safetensors it was made from, float32 logits (eager
attention, CPU, 1 thread; the stored weights upcast exactly) at every position of PROMPTS[0] and
PROMPTS[1] and at the last of PROMPTS[2], and the 16 greedy tokens after GREEDY_PROMPT (checked
against a cache-free argmax loop). Deterministic: rerunning writes a byte-identical file.
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_hf_fixtures import check_greedy, save_npz_deterministic  # noqa: E402
from tests.qwen3_next_checkpoints import (GREEDY_NEW, GREEDY_PROMPT, PROMPTS, REFERENCE, VARIANTS,  # noqa: E402
                                        weights_digest, write_checkpoint)


def reference(folder: str, name: str, arrays: dict) -> None:
    from transformers import Qwen3NextForCausalLM, GenerationConfig

    model, info = Qwen3NextForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                                        output_loading_info=True)
    model.eval()
    assert not info["missing_keys"] and not info["mismatched_keys"] and not info["unexpected_keys"], info
    arrays[f"{name}__weights_sha256"] = np.asarray(weights_digest(folder))
    with torch.no_grad():
        for k, ids in enumerate(PROMPTS):
            logits = model(input_ids=torch.tensor([ids])).logits[0].numpy()
            assert np.isfinite(logits).all()
            arrays[f"{name}__logits{k}"] = logits[-1:] if k == 2 else logits

        gen = GenerationConfig(do_sample=False, max_new_tokens=GREEDY_NEW, min_new_tokens=0, eos_token_id=None,
                               pad_token_id=317, bos_token_id=None)
        x = torch.tensor([GREEDY_PROMPT])
        new = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gen)[0, len(x[0]):]
        margins = check_greedy(model, GREEDY_PROMPT, new.tolist())
        arrays[f"{name}__greedy_ids"] = new.numpy().astype(np.int64)
    print(f"{name}: greedy {new.tolist()}, min top1-top2 margin {min(margins):.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=REFERENCE)
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    arrays = {}
    for name in VARIANTS:
        with tempfile.TemporaryDirectory() as folder:
            reference(write_checkpoint(folder, name), name, arrays)
    import transformers
    arrays["versions"] = np.asarray(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                                                "numpy": np.__version__}))
    save_npz_deterministic(args.out, arrays)
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1024:.0f} KiB): {sorted(arrays)}")


if __name__ == "__main__":
    main()
