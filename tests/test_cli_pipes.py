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
