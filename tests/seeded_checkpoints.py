"""What the tiny seeded checkpoints of tests/deepseek_checkpoints.py and
tests/qwen3_next_checkpoints.py share: their prompts, their folder's layout and its digest, and
the runs their tests compare with transformers' numbers or with each other."""
import hashlib
import json
import os
import shutil

from pocketcupy import Engine, SamplingParams

from .helpers import full_logits, load_reference_model, rel_err, write_safetensors

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
TOKENIZER = os.path.join(FIXTURES, "tiny_llama")

# token-id prompts (no BOS): logits at every position of the first two, at the last of the third
PROMPTS = [[318], [318, 117, 115, 101, 114, 198, 72], [(i * 37 + 11) % 317 for i in range(39)] + [319]]
GREEDY_PROMPT = [318, 300, 45, 12, 250, 99, 7, 198]
GREEDY_NEW = 16

# concurrent requests, two of them sharing a 24-token prefix, and each one's max_tokens
PREFIX = [(i * 29 + 5) % 317 for i in range(24)]
BATCH = [GREEDY_PROMPT, PREFIX + [17, 5, 9], PROMPTS[1], PREFIX + [200, 3], [(i * 13 + 1) % 317 for i in range(19)]]
MAX_TOKENS = [8, 6, 7, 5, 6]


def write_folder(folder, config: dict, tensors: dict) -> str:
    """A Hugging Face folder: config.json, model.safetensors of tensors ({HF name: (safetensors
    dtype, array)}) and tiny_llama's tokenizer files."""
    folder = str(folder)
    os.makedirs(folder, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(TOKENIZER, f), folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors)
    return folder


def weights_digest(folder) -> str:
    """sha256 of model.safetensors: the fixtures were made from the same bytes."""
    with open(os.path.join(str(folder), "model.safetensors"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def greedy(max_tokens: int, n: int = 1) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, n=n)


def logits_error(folder, ref, name: str) -> float:
    """The largest relative error of the model's logits for PROMPTS against those of the variant
    name in the fixture ref (every position, or the last one)."""
    assert weights_digest(folder) == str(ref[f"{name}__weights_sha256"]), "the seeded weights changed"
    model, ops = load_reference_model(folder)
    errors = []
    for k, ids in enumerate(PROMPTS):
        want = ref[f"{name}__logits{k}"]
        errors.append(rel_err(full_logits(model, ops, ids)[-len(want):], want))
    return max(errors)


def greedy_ids(folder, **engine_args) -> list[int]:
    """The GREEDY_NEW greedy tokens after GREEDY_PROMPT."""
    engine = Engine(folder, device="cpu", progress=False, **engine_args)
    return engine.generate(GREEDY_PROMPT, greedy(GREEDY_NEW))[0].outputs[0].token_ids


def batch_alone(folder) -> list[list[int]]:
    """Each request of BATCH run alone."""
    engine = Engine(folder, device="cpu", progress=False, num_kv_blocks=64, enable_prefix_caching=False)
    return [engine.generate(p, greedy(m))[0].outputs[0].token_ids for p, m in zip(BATCH, MAX_TOKENS)]


def batch_tiny(folder, device: str = "cpu", prepare=None, **engine_args) -> tuple[Engine, list[list[int]]]:
    """BATCH at once in 11 usable blocks of 4 tokens (any one request fits, all five do not): the
    engine and each request's tokens. prepare(engine), where given, runs before the requests."""
    engine = Engine(folder, device=device, progress=False, num_kv_blocks=12, block_size=4, max_num_batched_tokens=40,
                    **engine_args)
    if prepare is not None:
        prepare(engine)
    return engine, [o.outputs[0].token_ids for o in engine.generate(BATCH, [greedy(m) for m in MAX_TOKENS])]


def variant_fixture(variants, write_checkpoint):
    """A module-scoped fixture (name, checkpoint folder) over the variants, each folder written by
    write_checkpoint(folder, name) once a test module, which assigns it as `variant = ...`. (pytest
    is imported here: the scripts that build models from the checkpoint modules run without it.)"""
    import pytest

    @pytest.fixture(scope="module", params=list(variants))
    def variant(request, tmp_path_factory):
        name = request.param
        return name, write_checkpoint(tmp_path_factory.mktemp(name), name)
    return variant
