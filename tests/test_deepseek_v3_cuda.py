"""DeepSeek-V3 on the CUDA backend (MLA: cuda_src/attn_mla.cu with cuBLAS for the absorbed
projections; the grouped sigmoid router in moe_route.cu; the experts of moe_experts.cu; each checked
against NumPy in tests/kernel_rows_mla.py): the tiny checkpoints' logits against transformers'
(tests/fixtures/deepseek_v3_logits.npz, bounded as tests/cuda_rounding.py says), and the engine's
tokens batched with chunked prefill, preemption and prefix hits on the latent pages (fp16, int8;
fp8 by its logits) against the NumPy backend's alone."""
import dataclasses

import numpy as np
import pytest

from pocketcupy import Engine
from pocketcupy.backend.ops_ref import NumpyOps
from pocketcupy.loader import load_checkpoint
from pocketcupy.models.registry import build_model

from .cuda_rounding import MEDIAN_TOL, SimulatedCudaRounding, backend_error, median_error
from .deepseek_checkpoints import REFERENCE, VARIANTS, write_checkpoint
from .helpers import full_logits
from .seeded_checkpoints import (BATCH, GREEDY_NEW, GREEDY_PROMPT, MAX_TOKENS, PREFIX, PROMPTS, batch_alone, batch_tiny,
                                 greedy, variant_fixture)

REF = np.load(REFERENCE)
FP16_ACTIVATIONS = [name for name, (_, dtype, _) in VARIANTS.items() if dtype == "F32"]


variant = variant_fixture(VARIANTS, write_checkpoint)     # (name, folder) of each variant


@pytest.mark.gpu
def test_logits_close_to_transformers(variant):
    from pocketcupy.backend.ops_cuda import CudaOps

    name, folder = variant
    err = backend_error(REF, name, folder, CudaOps())
    assert err <= MEDIAN_TOL[VARIANTS[name][1]], f"{name}: median relative error {err:.2e}"


def test_simulated_cuda_roundings_within_half_the_bound(variant):
    name, folder = variant
    stored = VARIANTS[name][1]
    assert backend_error(REF, name, folder, SimulatedCudaRounding(stored)) <= MEDIAN_TOL[stored] / 2


@pytest.mark.gpu
@pytest.mark.parametrize("name", FP16_ACTIVATIONS)
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])      # fp8: test_fp8_pages_close_to_the_numpy_backend
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_batched_with_preemption_and_prefix_hits_matches_the_numpy_backend(tmp_path, name, kv_cache_dtype,
                                                                         cuda_graphs):
    """BATCH at once in 11 usable blocks of 4 tokens, prefills in chunks of at most 40 tokens a step,
    decode rows (in graphs, padding rows included) beside prefill chunks: each request's tokens as
    the NumPy backend gives it alone; then a request over the latents another left cached."""
    folder = write_checkpoint(tmp_path, name)
    alone = batch_alone(folder)
    engine, got = batch_tiny(folder, "cuda", max_num_seqs=4, cuda_graphs=cuda_graphs, kv_cache_dtype=kv_cache_dtype)
    assert (engine.runner.graphs is not None) == cuda_graphs      # the experts run per (row, pick) pair
    assert got == alone
    st = engine.stats()
    assert st["num_preemptions"] > 0 and st["prefix_cache_hits"] > 0
    engine.generate(BATCH[1], greedy(1))
    again = engine.generate(BATCH[3], greedy(MAX_TOKENS[3]))[0]
    assert again.num_cached_tokens == len(PREFIX) and again.outputs[0].token_ids == alone[3]


@pytest.mark.gpu
def test_fp8_pages_close_to_the_numpy_backend(variant):
    """fp8 latent pages against the NumPy backend's, by the logits of every prompt position. Tokens
    are not compared: E4M3 codes are 1/16 of a value apart, so latents an ulp apart before the
    rounding (the GPU's 16-bit activations) take other codes, and on an H100 the batched greedy
    tokens of ds_plain parted from NumPy's at the third token."""
    from pocketcupy.backend.ops_cuda import CudaOps

    name, folder = variant
    ck = load_checkpoint(folder)
    logits = []
    for ops in (CudaOps(), NumpyOps()):
        model = build_model(ck.config, ck.tensors, ops)
        logits.append(np.concatenate([full_logits(model, ops, ids, kv_cache_dtype="fp8") for ids in PROMPTS]))
    err = median_error(*logits)
    assert err <= MEDIAN_TOL[VARIANTS[name][1]], f"{name}: median relative error {err:.2e}"


@pytest.mark.gpu
def test_ngram_drafts_keep_the_tokens_of_plain_decoding(variant):
    """n-gram drafts verified through the decode graphs: the tokens of plain CUDA decoding."""
    _, folder = variant
    plain = Engine(folder, device="cuda", progress=False, kv_cache_memory=1 << 24)
    want = plain.generate(GREEDY_PROMPT, greedy(GREEDY_NEW))[0].outputs[0].token_ids
    spec = Engine(folder, device="cuda", progress=False, kv_cache_memory=1 << 24, speculative_method="ngram",
                  num_speculative_tokens=3)
    assert spec.generate(GREEDY_PROMPT, greedy(GREEDY_NEW))[0].outputs[0].token_ids == want


@pytest.mark.parametrize("changes, match", [
    (dict(kv_lora_rank=600), r"kv_lora_rank \+ qk_rope_head_dim = 616 has no CUDA MLA kernel"),
    (dict(kv_lora_rank=36), r"kv_lora_rank \+ qk_rope_head_dim = 52 has no CUDA MLA kernel"),
    (dict(n_routed_experts=66, n_group=33), r"n_group 33 has no CUDA kernel \(they take 1 to 32\)"),
])
def test_sizes_without_cuda_kernels_refused(tmp_path, changes, match):
    """CudaOps.check_config (engine build, after the model): the fields the kernels cannot take."""
    from pocketcupy.backend.ops_cuda import CudaOps

    c = load_checkpoint(write_checkpoint(tmp_path, "ds_plain")).config
    if "kv_lora_rank" in changes:
        c = dataclasses.replace(c, head_dim=changes["kv_lora_rank"] + c.rope_dim)
    else:
        c = dataclasses.replace(c, moe=dataclasses.replace(c.moe, **changes))
    with pytest.raises(ValueError, match=match + r".*; device='cpu' runs it"):
        object.__new__(CudaOps).check_config(c)
    NumpyOps().check_config(c)
