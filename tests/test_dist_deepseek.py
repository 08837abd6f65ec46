"""DeepSeek-V3 / V2 (MLA + MoE) over tensor-parallel ranks on the CPU: query heads, kv_b and the
output projection split by head over a latent cache every rank keeps whole, every expert's (and
the shared and dense MLPs') columns split; greedy tokens and logprobs at 2 (and 4) ranks equal one
rank's for safetensors folders and a deepseek2 GGUF, batched with preemption and prefix hits, and
the sizes that do not split refused before any rank starts."""
import dataclasses
import multiprocessing as mp

import pytest

from pocketcupy import SamplingParams
from pocketcupy.dist.layout import ShardLayout
from pocketcupy.loader import load_checkpoint

from .deepseek_checkpoints import write_checkpoint
from .seeded_checkpoints import BATCH, GREEDY_PROMPT, batch_alone, batch_tiny
from .test_dist_engine import assert_same_generation, engine

PROMPTS = [GREEDY_PROMPT, BATCH[1], BATCH[4]]
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2)


def assert_ranks_equal_one(path, tp=2):
    """Greedy tokens equal, logprobs within float32 rounding of the partial sums' other order."""
    assert_same_generation(path, tp, engine(path, 1).generate(PROMPTS, PARAMS), PROMPTS, PARAMS, max_gap=1e-4)


@pytest.mark.parametrize("name, tp", [
    ("ds_lora_yarn", 2),    # V3: q LoRA, yarn, attention biases (o_proj's added once), BF16
    ("ds_plain", 4),        # V3: q_proj, tied embeddings, one head a rank
    ("ds2_group", 2),       # V2: softmax router within the best groups
])
def test_folder_at_ranks_equals_one_rank(tmp_path, name, tp):
    assert_ranks_equal_one(write_checkpoint(tmp_path, name), tp)


def test_gguf_deepseek2_at_two_ranks_equals_one_rank(tmp_path):
    """llama.cpp's layout (stacked experts as per-expert views, attn_kv_b joined back) in F16."""
    pytest.importorskip("gguf")
    from .deepseek_gguf import write_gguf

    assert_ranks_equal_one(write_gguf(tmp_path / "f16.gguf", "ds_plain", "F16", {"rope_interleave": True}))


def test_batch_with_preemption_and_prefix_hits_at_two_ranks(tmp_path):
    folder = write_checkpoint(tmp_path, "ds_lora_yarn")
    eng, got = batch_tiny(folder, tensor_parallel_size=2)
    try:
        st = eng.stats()
    finally:
        eng.close()
    assert got == batch_alone(folder)
    assert st["num_preemptions"] > 0 and st["prefix_cache_hits"] > 0


def test_sizes_that_do_not_split_are_refused_before_any_rank_starts(tmp_path):
    pytest.importorskip("gguf")
    from .deepseek_gguf import write_gguf

    before = set(mp.active_children())
    folder = write_checkpoint(tmp_path, "ds_plain")
    with pytest.raises(ValueError, match="tensor_parallel_size: 3 does not divide the model's 4 attention heads"):
        engine(folder, 3)
    q8 = write_gguf(tmp_path / "q8.gguf", "ds_plain", "Q8_0", {"rope_interleave": True})
    with pytest.raises(ValueError, match=r"tensor_parallel_size: blk.0.ffn_down.weight \(Q8_0, 32-value blocks\) "
                                         "cannot be split at column 48"):
        engine(q8, 2)
    assert set(mp.active_children()) == before


def test_mla_layout_and_expert_sizes(tmp_path):
    """Every rank: its query heads and the one latent KV head; an expert MLP size the ranks cannot
    share is refused by the layout."""
    c = load_checkpoint(write_checkpoint(tmp_path, "ds_plain")).config
    assert [(x.q_heads, x.kv_heads) for x in (ShardLayout.of(c, r, 2) for r in range(2))] == \
        [((0, 2), (0, 1)), ((2, 4), (0, 1))]
    odd = dataclasses.replace(c, moe=dataclasses.replace(c.moe, moe_intermediate_size=33))
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 2 does not divide the experts' MLP size "
                                         r"\(moe_intermediate_size 33\)"):
        ShardLayout.of(odd, 0, 2)
