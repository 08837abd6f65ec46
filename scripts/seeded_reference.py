"""What transformers computes for tiny seeded checkpoints (tests/seeded_checkpoints.py): the body
of make_deepseek_fixtures.py and make_qwen3_next_fixtures.py, which name the module of checkpoints
(VARIANTS, REFERENCE, write_checkpoint); each is loaded with the class its config.json names."""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from make_hf_fixtures import check_greedy, save_npz_deterministic, torch  # noqa: E402
from tests.seeded_checkpoints import GREEDY_NEW, GREEDY_PROMPT, PROMPTS, weights_digest  # noqa: E402


def reference(folder: str, name: str, arrays: dict, unexpected_prefix: str | None) -> None:
    """The variant's logits and greedy tokens into arrays; unexpected_prefix: the weights
    transformers may leave out (none other may be unexpected, missing or mismatched)."""
    import transformers
    from transformers import GenerationConfig

    with open(os.path.join(folder, "config.json")) as f:
        model_class = json.load(f)["architectures"][0]
    model, info = getattr(transformers, model_class).from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    model.eval()
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    unexpected = {k for k in info["unexpected_keys"] if not (unexpected_prefix and k.startswith(unexpected_prefix))}
    assert not unexpected, unexpected
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


def main(doc: str, checkpoints, unexpected_prefix: str | None = None) -> None:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=checkpoints.REFERENCE)
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    arrays = {}
    for name in checkpoints.VARIANTS:
        with tempfile.TemporaryDirectory() as folder:
            reference(checkpoints.write_checkpoint(folder, name), name, arrays, unexpected_prefix)
    import transformers
    arrays["versions"] = np.asarray(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                                                "numpy": np.__version__}))
    save_npz_deterministic(args.out, arrays)
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1024:.0f} KiB): {sorted(arrays)}")


if __name__ == "__main__":
    sys.exit(f"{os.path.basename(__file__)}: a module the make_*_fixtures.py scripts of seeded checkpoints "
             "import, not a script to run")
