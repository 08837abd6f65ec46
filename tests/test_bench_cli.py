"""The benchmark scripts' command lines where they cannot run: one line saying why and exit 2, not a
traceback; their --help says what they do in whole sentences. The fixture scripts without their
reference implementations alike."""
import ast
import importlib.util
import os
import subprocess
import sys

import pytest

from pocketcupy.backend import cuda_available
from tests.test_server_harness import ROOT, free_port


def _run(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script), *args], capture_output=True,
                          text=True, timeout=120)


def test_bench_serve_without_a_server_says_so():
    for url, says in ((f"http://127.0.0.1:{free_port()}", "is a server running there?"),
                      ("127.0.0.1:8000", "--base-url must be an http:// or https:// URL")):
        out = _run("bench_serve.py", "--base-url", url)
        assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.skipif(cuda_available(), reason="a GPU is present")
@pytest.mark.parametrize("script, args", [("bench_kernels.py", []), ("bench_decode_kernels.py", []),
                                          ("profile_kernels.py", ["M"]), ("profile_marginal.py", ["M"]),
                                          ("profile_variants.py", ["M", "--variant", "base="]),
                                          ("profile_decode.py", ["M"]), ("compare_backends.py", ["M"])])
def test_gpu_only_scripts_without_a_gpu_say_so(smollm2_gguf, script, args):
    # the profile scripts and compare_backends.py were a traceback from the engine or `import cupy`
    out = _run(script, *(smollm2_gguf if a == "M" else a for a in args))
    assert out.returncode == 2 and "CuPy with a usable GPU is not available" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("script, module", [
    *((s, "torch") for s in ("make_hf_fixtures.py", "make_deepseek_fixtures.py", "make_deepseek_v2_fixtures.py",
                              "make_qwen3_next_fixtures.py", "seeded_reference.py")),
    ("make_llamacpp_fixtures.py", "llama_cpp")])
def test_fixture_scripts_without_their_reference_say_so(tmp_path, script, module):
    # they were a ModuleNotFoundError traceback (the torch ones at --help too)
    if importlib.util.find_spec(module):
        pytest.skip(f"{module} is installed")
    out = _run(script, "--out", str(tmp_path))
    assert out.returncode == 1 and out.stderr.startswith(f"{script}: error: needs {module}, which is not a "
                                                         "project dependency"), out.stderr
    assert len(out.stderr.splitlines()) == 1


@pytest.mark.parametrize("module", ["bench_args.py", "reference_deps.py"])
def test_script_helpers_say_they_are_not_scripts(module):
    # run (e.g. with --help, as every file in scripts/), they did nothing, exit 0
    out = _run(module, "--help")
    assert out.returncode == 1 and out.stderr == f"{module}: a module the " \
        f"{'benchmark' if module == 'bench_args.py' else 'fixture'} scripts import, not a script to run\n"


MODEL_BENCHES = ["bench_throughput.py", "bench_decode.py", "bench_spec.py", "bench_structured.py"]


@pytest.mark.parametrize("script, args, says", [
    *((s, ["/nonexistent.gguf"], "model: /nonexistent.gguf does not exist") for s in MODEL_BENCHES),
    ("bench_throughput.py", ["M", "--concurrency", "4", "-1"], "argument --concurrency: must be at least 1, got -1"),
    ("bench_throughput.py", ["M", "--device", "cpu", "--prompt", "9000"],
     "--prompt 9000 + --output 256 tokens do not fit the model's 8192"),
    ("bench_throughput.py", ["M", "--device", "gpu"], "device: must be 'auto', 'cpu' or 'cuda', got 'gpu'"),
    ("bench_decode.py", ["M", "--decode-tokens", "1"], "argument --decode-tokens: must be at least 2, got 1"),
    ("bench_decode.py", ["M", "--kv-cache-gb", "0"], "argument --kv-cache-gb: must be at least 1, got 0"),
    ("bench_spec.py", ["M", "--draft-model", "/nonexistent.gguf"], "--draft-model: /nonexistent.gguf does not exist"),
    ("bench_spec.py", ["M", "--device", "cpu", "--max-model-len", "64", "--max-tokens", "60"],
     "--max-tokens 60: with the longest prompt"),
    ("bench_structured.py", ["M", "--batch", "0"], "argument --batch: must be at least 1, got 0"),
    ("bench_structured.py", ["M", "--schema", "/nonexistent.json"], "--schema: [Errno 2] No such file"),
])
def test_model_benches_refuse_bad_arguments_in_one_line(smollm2_gguf, script, args, says):
    """A missing model, a count below its least, a device Engine refuses, a prompt longer than the
    model's context: a usage error (exit 2) naming it, before any benchmark runs, not a traceback."""
    out = _run(script, *[smollm2_gguf if a == "M" else a for a in args])
    assert out.returncode == 2 and f"{script}: error: {says}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.skipif(cuda_available(), reason="a GPU is present")
@pytest.mark.parametrize("script", MODEL_BENCHES)
def test_model_benches_asked_for_cuda_without_a_gpu_say_so(smollm2_gguf, script):
    out = _run(script, smollm2_gguf, "--device", "cuda")
    assert out.returncode == 2 and "device: 'cuda' requested but CuPy with a usable GPU is not available" \
        in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args, says", [
    (["--qtypes", "BF16,Q4_X"], "--qtypes: unknown 'Q4_X' (choose from F16, BF16, FP8, NVFP4, Q4_0"),
    (["--only", "gemv,gemvv"], "--only: unknown 'gemvv' (choose from gemv, batch, gemm, attention)"),
    (["--tile-shapes", "24138,24"], "--tile-shapes: '24' is not 4 or 5 digits"),
    (["--reps", "0"], "argument --reps: must be at least 1, got 0"),
])
def test_bench_kernels_refuses_bad_arguments_before_the_gpu(args, says):
    """Usage errors with or without a GPU (on one, an unknown qtype was a KeyError after the ceilings'
    timing; without one, the same command said only that it needs a GPU)."""
    out = _run("bench_kernels.py", *args)
    assert out.returncode == 2 and f"bench_kernels.py: error: {says}" in out.stderr, out.stderr


@pytest.mark.parametrize("args, says", [
    (["--only", "gemv,smal"], "--only: unknown 'smal' (choose from gemv, small)"),
    (["--reps", "0"], "argument --reps: must be at least 1, got 0"),
    (["--batches", "1,x"], "--batches: 'x' is not a batch size of at least 1"),
    (["--configs", "lanes:16:2,xs"], "--configs: 'xs' is not a launch config"),
    (["--shapes", "Q4_1:960"], "--shapes: 'Q4_1:960' is not QTYPE:ROWSxCOLS"),
    (["--q6k-layouts", "relaid,rawr"], "--q6k-layouts: unknown 'rawr' (choose from relaid, raw)"),
])
def test_bench_decode_kernels_refuses_bad_arguments_before_the_gpu(args, says):
    """Usage errors with or without a GPU (without one, they said only that it needs a GPU; on one, a bad
    --configs, --shapes or --batches entry was a traceback mid-run, an unknown --only name ran nothing)."""
    out = _run("bench_decode_kernels.py", *args)
    assert out.returncode == 2 and f"bench_decode_kernels.py: error: {says}" in out.stderr, out.stderr


@pytest.mark.parametrize("script", ["bench_kernels.py", "bench_decode_kernels.py", "profile_kernels.py",
                                    "profile_marginal.py", "profile_variants.py", "profile_host.py",
                                    "gen_gguf_tables.py"])
def test_help_describes_the_script_in_its_first_paragraph(script):
    # the description was the docstring's first line, cut mid-sentence ("... captured again with one op")
    with open(os.path.join(ROOT, "scripts", script)) as f:
        first = ast.get_docstring(ast.parse(f.read())).split("\n\n")[0]
    out = _run(script, "--help")
    assert out.returncode == 0, out.stderr
    assert " ".join(first.split()) in " ".join(out.stdout.split()), out.stdout
