"""The benchmark scripts' command lines where they cannot run: one line saying why and exit 2, not a
traceback; their --help says what they do in whole sentences."""
import ast
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
@pytest.mark.parametrize("script", ["bench_kernels.py", "bench_decode_kernels.py"])
def test_kernel_benches_without_a_gpu_say_so(script):
    out = _run(script)
    assert out.returncode == 2 and "CuPy with a usable GPU is not available" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("script", ["bench_kernels.py", "bench_decode_kernels.py", "profile_kernels.py",
                                    "profile_marginal.py", "profile_variants.py", "profile_host.py"])
def test_help_describes_the_script_in_its_first_paragraph(script):
    # the description was the docstring's first line, cut mid-sentence ("... captured again with one op")
    with open(os.path.join(ROOT, "scripts", script)) as f:
        first = ast.get_docstring(ast.parse(f.read())).split("\n\n")[0]
    out = _run(script, "--help")
    assert out.returncode == 0, out.stderr
    assert " ".join(first.split()) in " ".join(out.stdout.split()), out.stdout
