"""`python -m pocketcupy run-batch -i - -o -` as a real subprocess, fed lines that are no request in one
way or another: each gets its own error line, in the input's order, and the others are answered."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BODY = {"model": "smol", "prompt": "Hello", "max_tokens": 2, "temperature": 0}


def _line(custom_id, body=None) -> bytes:
    req = {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body or BODY}
    return json.dumps(req).encode()


LINES = [
    b"\xef\xbb\xbf" + _line("first"),   # a BOM, as Windows tools write
    b"[" * 100_000,   # deeper than json's recursion limit
    _line("first", {**BODY, "prompt": "again"}),
    _line("latin-1", {**BODY, "prompt": "caf\u00e9"}).replace(b"\\u00e9", b"\xe9"),
    _line("\ud800"),   # a lone surrogate, as its JSON escape
    _line("last"),
]


@pytest.fixture(scope="module")
def results(smollm2_gguf):
    r = subprocess.run([sys.executable, "-m", "pocketcupy", "run-batch", "-i", "-", "-o", "-", "--model",
                        smollm2_gguf, "--device", "cpu", "--served-model-name", "smol"],
                       input=b"\n".join(LINES) + b"\n", capture_output=True, timeout=300, cwd=ROOT)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0 and "Traceback" not in err, err
    assert "ready: model 'smol'" in err, err  # no server address: it said "ready on ?"
    return [json.loads(x) for x in r.stdout.decode("utf-8").splitlines()]


def _error(o, words):
    assert o["response"] is None and o["error"]["code"] == "invalid_request", o
    assert words in o["error"]["message"], o


def test_every_line_answered_in_order(results):
    """The first line starts with a BOM: it was an error line (Unexpected UTF-8 BOM)."""
    assert len(results) == len(LINES)
    assert results[0]["custom_id"] == "first" and results[-1]["custom_id"] == "last"
    assert results[0]["response"]["status_code"] == 200 and results[-1]["response"]["status_code"] == 200


def test_json_nested_too_deep(results):
    """A RecursionError out of json.loads ended the whole batch with a traceback."""
    _error(results[1], "line 2: the JSON nests too deep")


def test_custom_id_given_twice(results):
    """A second line with the same custom_id was answered too: two results nobody could tell apart."""
    _error(results[2], "line 3: 'custom_id' 'first' is line 1's too")
    assert results[2]["custom_id"] == "first"


def test_line_that_is_no_utf8(results):
    """A line in Latin-1 ended the whole batch with a UnicodeDecodeError traceback."""
    _error(results[3], "line 4: 'utf-8' codec can't decode byte 0xe9")


def test_custom_id_with_a_lone_surrogate(results):
    """Writing the result, whose custom_id no UTF-8 can hold, was a UnicodeEncodeError ending the batch;
    it is written as its JSON escape, as it came."""
    assert results[4]["custom_id"] == "\ud800" and results[4]["response"]["status_code"] == 200


def test_bad_files_refused_before_the_model_loads(tmp_path):
    """An output file in no folder, or a folder, was found only once the model had loaded (exit 3); the
    input file given as the output was erased (opened for writing) and the batch had no requests."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(_line("a") + b"\n")
    for out, words in ((tmp_path / "no" / "out.jsonl", "--output-file: there is no folder"),
                       (tmp_path, "is a folder"), (src, "is the --input-file")):
        r = subprocess.run([sys.executable, "-m", "pocketcupy", "run-batch", "-i", str(src), "-o", str(out)],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert "loading" not in r.stderr
    assert src.read_bytes() == _line("a") + b"\n"
    r = subprocess.run([sys.executable, "-m", "pocketcupy", "run-batch", "-i", str(tmp_path / "none.jsonl"), "-o",
                        "-"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "error: --input-file: cannot read it" in r.stderr and "none.jsonl" in r.stderr
