"""Qwen3-Next GGUF files (llama.cpp's "qwen3next"): the tiny all-MoE checkpoint of
tests/qwen3_next_checkpoints.py written as llama.cpp's converter writes it
(tests/qwen3_next_gguf.py), against transformers' logits and greedy tokens for it and the same
checkpoint's safetensors folder; the older single ssm_in; a Q8_0 file near them; the refused
variants, each naming its key or tensor; Qwen3.5's files ("qwen35", "qwen35moe") with their value
heads in llama.cpp's tiled order."""
import numpy as np
import pytest

pytest.importorskip("gguf")

from pocketcupy import Engine  # noqa: E402
from pocketcupy.loader import load_checkpoint  # noqa: E402

from .helpers import full_logits, load_reference_model, rel_err  # noqa: E402
from .qwen3_next_checkpoints import REFERENCE, VARIANTS, write_checkpoint  # noqa: E402
from .qwen3_next_gguf import tiled, write_gguf  # noqa: E402
from .seeded_checkpoints import GREEDY_NEW, GREEDY_PROMPT, PROMPTS, greedy  # noqa: E402

NAME = "q3n_moe"     # llama.cpp converts MoE on every layer only
REF = np.load(REFERENCE)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(safetensors folder, F32 GGUF, F32 GGUF with the older ssm_in)."""
    d = tmp_path_factory.mktemp("q3n")
    return (write_checkpoint(d / "hf", NAME), write_gguf(d / "f32.gguf", NAME), write_gguf(d / "old.gguf", NAME,
                                                                                            legacy=True))


def _logits(path) -> list[np.ndarray]:
    model, ops = load_reference_model(path)
    return [full_logits(model, ops, ids) for ids in PROMPTS]


def test_same_weights_and_config_as_the_folder(files):
    """Every tensor the model reads under its name, to float32 rounding of the 1 + w norms and
    of -exp(A_log) (its weights are bfloat16)."""
    folder, path, _ = files
    want, got = load_checkpoint(folder), load_checkpoint(path)
    assert got.config.architecture == "qwen3_next" and sorted(got.tensors) == sorted(want.tensors)
    for k, t in want.tensors.items():
        np.testing.assert_allclose(got.tensors[k].dequantize(), t.dequantize(), rtol=1e-6, atol=1e-7, err_msg=k)
    c, w = got.config, want.config
    assert (c.gdn, c.moe, c.rope_dim, c.rope_interleaved, c.qk_norm, c.head_dim) == (w.gdn, w.moe, 4, False, True, 16)


@pytest.mark.parametrize("which", [1, 2], ids=["attn_qkv_gate", "ssm_in"])
def test_logits_match_transformers(files, which):
    path = files[which]
    model, ops = load_reference_model(path)
    for k, ids in enumerate(PROMPTS):
        want = REF[f"{NAME}__logits{k}"]
        assert rel_err(full_logits(model, ops, ids)[-len(want):], want) <= 1e-5


def test_engine_greedy_tokens_and_tokenizer(files):
    folder, path, _ = files
    a, b = (Engine(p, device="cpu", progress=False) for p in (path, folder))
    assert a.generate(GREEDY_PROMPT, greedy(GREEDY_NEW))[0].outputs[0].token_ids == REF[f"{NAME}__greedy_ids"].tolist()
    text = "the history of the world, and then some"
    assert a.tokenizer.encode(text) == b.tokenizer.encode(text)


def test_q8_0_file(files, tmp_path):
    """Matrices in Q8_0 (attn_qkv and attn_gate joined as blocks, the experts as views of theirs):
    each weight within Q8_0's rounding of the folder's. The logits (activations rounded to int8
    too, as llama.cpp's Q8_0 products) drift further through the recurrent state and where a token
    turns to other experts: the median row is compared, loosely."""
    folder = files[0]
    path = write_gguf(tmp_path / "q8.gguf", NAME, "Q8_0")
    t, want = load_checkpoint(path).tensors, load_checkpoint(folder).tensors
    assert t["blk.0.ssm_in_qkvz.weight"].qtype == "Q8_0" and t["blk.0.ffn_up_exps.5.weight"].qtype == "Q8_0"
    for k, w in want.items():   # each weight within Q8_0's rounding of its own (rows in place)
        w = w.dequantize()
        assert np.abs(t[k].dequantize() - w).max() <= 0.01 * np.abs(w).max() + 1e-6, k
    for got, ref in zip(_logits(path), _logits(folder)):
        assert np.median(np.abs(got - ref).max(axis=1)) / np.abs(ref).max() <= 0.2


@pytest.mark.parametrize("metadata, drop, match", [
    ({"qwen3next.ssm.time_step_rank": None}, (), "lacks qwen3next.ssm.time_step_rank"),
    ({"qwen3next.ssm.inner_size": 62}, (), "ssm.inner_size 62 is not a multiple of qwen3next.ssm.time_step_rank 4"),
    ({"qwen3next.ssm.group_count": 3}, (), "linear_num_value_heads 4 is not a multiple of linear_num_key_heads 3"),
    ({"qwen3next.nextn_predict_layers": 4}, (), "nextn_predict_layers 4 leaves no decoder layers"),
    ({"qwen3next.full_attention_interval": 8}, (), "layer_types has no 'full_attention' layer"),
    ({"qwen3next.expert_count": None}, (), "lacks qwen3next.expert_count"),
    ({}, ("blk.2.attn_gate.weight",), r"'blk.2.attn_gate.weight' is missing \(attn_qkv and attn_gate come in pairs"),
    ({"qwen3next.ssm.state_size": 8}, (), r"'blk.0.attn_qkv.weight' has shape \(128, 64\), but the metadata needs "
                                          r"\(96, 64\)"),
    ({"qwen3next.rope.dimension_count": 18}, (), "rope dimension 18 must be even and at most the head dimension 16"),
])
def test_refused_variants_name_the_key_or_tensor(tmp_path, metadata, drop, match):
    path = write_gguf(tmp_path / "m.gguf", NAME, metadata=metadata, drop=drop)
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(path)
    assert path in str(e.value)


@pytest.fixture(scope="module", params=["q35_dense", "q35_moe"])
def qwen35(request, tmp_path_factory):
    """(name, safetensors folder, F32 GGUF) of a Qwen3.5 variant ("qwen35", "qwen35moe")."""
    name = request.param
    d = tmp_path_factory.mktemp(name)
    return name, write_checkpoint(d / "hf", name), write_gguf(d / "f32.gguf", name)


def _same_as_the_folder(got: dict, want: dict, config, tol: float) -> None:
    """Every tensor within tol (relative to its largest) of the folder's; ssm_out with its value
    heads tiled as llama.cpp stores them."""
    assert sorted(got) == sorted(want)
    for k, t in want.items():
        w = t.dequantize()
        if k.endswith("ssm_out.weight"):
            c = config.gdn
            w = tiled(w, 1, {"linear_num_key_heads": c.linear_num_key_heads,
                             "linear_num_value_heads": c.linear_num_value_heads}, c.linear_value_head_dim)
        assert np.abs(got[k].dequantize() - w).max() <= tol * np.abs(w).max() + 1e-7, k


def test_qwen35_files_match_transformers(qwen35):
    """Qwen3.5's value heads come back from llama.cpp's tiled order (the rows of attn_qkv's V part,
    the conv's V channels, attn_gate, ssm_beta, ssm_alpha, ssm_a, ssm_dt) or are met by the model
    (ssm_out's columns: out_proj_tiled): transformers' logits and greedy tokens (without either step
    the logits are off by more than their own size)."""
    name, folder, path = qwen35
    got, want = load_checkpoint(path), load_checkpoint(folder)
    assert got.config.architecture == want.config.architecture and got.config.gdn.out_proj_tiled
    assert (got.config.moe is None) == (name == "q35_dense")
    _same_as_the_folder(got.tensors, want.tensors, got.config, 1e-6)
    model, ops = load_reference_model(path)
    for k, ids in enumerate(PROMPTS):
        ref = REF[f"{name}__logits{k}"]
        assert rel_err(full_logits(model, ops, ids)[-len(ref):], ref) <= 3e-5   # test_qwen3_next's bound
    engine = Engine(path, device="cpu", progress=False)
    assert engine.generate(GREEDY_PROMPT, greedy(GREEDY_NEW))[0].outputs[0].token_ids == \
        REF[f"{name}__greedy_ids"].tolist()


def test_qwen35_q8_0_rows_untiled_as_blocks(tmp_path):
    """Q8_0 matrices: the tiled rows put back as whole rows of blocks, each weight within Q8_0's
    rounding of the folder's."""
    path = write_gguf(tmp_path / "q8.gguf", "q35_dense", "Q8_0")
    got = load_checkpoint(path)
    assert got.tensors["blk.0.ssm_in_qkv.weight"].qtype == "Q8_0"
    _same_as_the_folder(got.tensors, load_checkpoint(write_checkpoint(tmp_path / "hf", "q35_dense")).tensors,
                        got.config, 0.01)


@pytest.mark.gpu
def test_qwen35_file_on_cuda_matches_its_folder(qwen35):
    """On CUDA too (the output heads reordered for ssm_out on the device): transformers' logits within
    the bound of a float32 checkpoint (tests/cuda_rounding.py: the file is F32, so fp16 on the GPU),
    and the folder's to the bound of its stored type (a bfloat16 folder takes bf16 activations)."""
    from pocketcupy.backend.ops_cuda import CudaOps

    from .cuda_rounding import MEDIAN_TOL, backend_error, median_error, prompts_logits

    name, folder, path = qwen35
    ops = CudaOps()
    assert backend_error(REF, name, path, ops) <= MEDIAN_TOL["F32"]
    got, want = prompts_logits(path, ops), prompts_logits(folder, ops)
    assert median_error(np.concatenate(got), np.concatenate(want)) <= MEDIAN_TOL[VARIANTS[name][1]]
