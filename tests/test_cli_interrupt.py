"""Ctrl-C (SIGINT) in `python -m pocketcupy chat` and `generate`, real subprocesses with the real SmolLM2:
during a reply it stops that reply and the chat goes on; at the prompt it ends the chat, exit 130; never a
traceback (one was printed either way, and the reply's came from inside an engine step)."""
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORY = "Write a very long story about dragons, in many chapters.\n"


def _sigint_default():
    """In the child before exec: SIGINT at its default, as a terminal's foreground command has it. A test run
    started in the background (`cmd &` without job control) ignores SIGINT, its children inherit that, and
    Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(smollm2_gguf, *args):
    p = subprocess.Popen([sys.executable, "-m", "pocketcupy", *args, "--model", smollm2_gguf, "--device", "cpu",
                          "--max-tokens", "2000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=_sigint_default)
    err = ""
    while "loaded" not in err:   # the model is ready
        line = p.stderr.readline()
        assert line, err
        err += line
    return p, err


def _finish(p, err, stdin=""):
    try:
        out, rest = p.communicate(stdin, timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    err += rest
    assert "Traceback" not in err, err
    return out, err


def test_ctrl_c_stops_the_reply_and_the_chat_goes_on(smollm2_gguf):
    p, err = _start(smollm2_gguf, "chat")
    p.stdin.write(STORY)
    p.stdin.flush()
    time.sleep(2.0)   # the story is being written (first token after ~0.1 s; 2000 tokens take minutes)
    p.send_signal(signal.SIGINT)
    out, err = _finish(p, err, "What is the capital of France?\n")
    assert p.returncode == 0 and "[interrupted]" in err, err
    assert err.count("tok/s") == 1 and "Paris" in out   # the second question, answered in full


def test_ctrl_c_at_the_prompt_ends_the_chat(smollm2_gguf):
    p, err = _start(smollm2_gguf, "chat")
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = _finish(p, err)
    assert p.returncode == 130, err


def test_ctrl_c_stops_generate(smollm2_gguf):
    p, err = _start(smollm2_gguf, "generate", "Once upon a time")
    time.sleep(2.0)
    p.send_signal(signal.SIGINT)
    out, err = _finish(p, err)
    assert p.returncode == 130 and "[interrupted]" in err and out.strip(), err


def test_ctrl_c_stops_run_batch(smollm2_gguf, tmp_path):
    """The batch's thread pool waited for every line (minutes here) before the KeyboardInterrupt went up."""
    body = '"body": {"model": "smol", "prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0}'
    src = tmp_path / "in.jsonl"
    src.write_text("".join(f'{{"custom_id": "r{i}", "method": "POST", "url": "/v1/completions", {body}}}\n'
                           for i in range(16)))
    p = subprocess.Popen([sys.executable, "-m", "pocketcupy", "run-batch", "-i", str(src), "-o", "-", "--model",
                          smollm2_gguf, "--device", "cpu", "--served-model-name", "smol", "--concurrency", "4"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         preexec_fn=_sigint_default)
    err = ""
    while "ready" not in err:
        line = p.stderr.readline()
        assert line, err
        err += line
    time.sleep(2.0)
    p.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    try:
        out, rest = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 130 and "Traceback" not in rest and time.monotonic() - t0 < 30, rest
