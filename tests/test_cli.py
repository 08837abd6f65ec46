"""The command line: python -m pocketcupy generate/chat, scripts/fetch_models.py."""
import os
import subprocess
import sys

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


def test_bad_argument_is_a_clean_error(smollm2_gguf):
    r = run("-m", "pocketcupy", "generate", "hi", "--model", smollm2_gguf, "--device", "cpu", "--top-p", "2")
    assert r.returncode == 2 and "top_p" in r.stderr and "Traceback" not in r.stderr
    r = run("-m", "pocketcupy", "generate", "hi", "--model", "/nonexistent.gguf")
    assert r.returncode == 2 and "model" in r.stderr and "Traceback" not in r.stderr


def test_fetch_models_prints_path_last(smollm2_gguf):
    cache = os.path.dirname(smollm2_gguf)
    r = run("scripts/fetch_models.py", env={"POCKETCUPY_CACHE": cache})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == smollm2_gguf
    r = run("scripts/fetch_models.py", "--cache-dir", cache)
    assert r.stdout.strip().splitlines()[-1] == smollm2_gguf
