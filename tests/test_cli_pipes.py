"""The CLI's stdout read by a process that stops early (`python -m pocketcupy ... | head -1`): the command
ends quietly, exit code 1; it was a BrokenPipeError traceback (run-batch -o -, generate)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read_a_line_then_close(args):
    p = subprocess.Popen([sys.executable, "-m", "pocketcupy", *args, "--device", "cpu"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        first = p.stdout.readline()
        p.stdout.close()
        err = p.stderr.read()
        p.wait(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 1 and "Traceback" not in err and "BrokenPipe" not in err, err
    return first


def test_run_batch_to_stdout_read_in_part(smollm2_gguf, tmp_path):
    src = tmp_path / "in.jsonl"
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": "smol", "prompt": "Once upon a time", "max_tokens": 2 if i == 0 else 40}}
             for i in range(3)]
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    first = _read_a_line_then_close(["run-batch", "-i", str(src), "-o", "-", "--model", smollm2_gguf,
                                     "--served-model-name", "smol", "--concurrency", "1"])
    assert json.loads(first)["custom_id"] == "r0"


def test_generate_read_in_part(smollm2_gguf):
    _read_a_line_then_close(["generate", "Write a list of ten colours, one a line:\n1.", "--model", smollm2_gguf,
                             "--max-tokens", "100", "--temperature", "0"])


def test_piped_chat_prints_the_replies_alone(smollm2_gguf):
    """The interactive prompt "> " went to stdout with piped input too, before each reply and at the end."""
    r = subprocess.run([sys.executable, "-m", "pocketcupy", "chat", "--model", smollm2_gguf, "--device", "cpu",
                        "--max-tokens", "12"], input="What is the capital of France?\nAnd of Italy?\n",
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0 and r.stderr.count("tok/s") == 2, r.stderr
    lines = r.stdout.splitlines()
    assert "Paris" in lines[0] and not any(line.startswith(">") for line in lines), r.stdout
    assert r.stdout.endswith("\n") and not r.stdout.endswith("\n\n")


def test_chat_at_a_terminal_prompts_and_ends_on_ctrl_d(smollm2_gguf):
    """At a terminal (a pty here) the prompt is shown (input() writes it to stderr there); Ctrl-D ends the
    chat (exit 0) with a new line, for the shell's prompt."""
    import pty
    import select

    main, child = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "pocketcupy", "chat", "--model", smollm2_gguf, "--device", "cpu"],
                         stdin=child, stdout=child, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(child)
    err, out = b"", b""
    try:
        while not err.endswith(b"> "):
            chunk = os.read(p.stderr.fileno(), 1024)
            assert chunk, err
            err += chunk
        os.write(main, b"\x04")   # Ctrl-D at the start of a line: end of input
        assert p.wait(timeout=60) == 0
        while select.select([main], [], [], 2)[0]:
            try:
                out += os.read(main, 1024)
            except OSError:   # EIO: the child's side is closed and all read
                break
    finally:
        p.kill()
        os.close(main)
    assert out == b"\r\n" and b"Traceback" not in err
