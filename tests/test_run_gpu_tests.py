"""scripts/run_gpu_tests.py: the GPU set's kernel rows dealt to several processes, the other GPU tests
in one of their own, and pytest's summaries read back."""
import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCRIPT = os.path.join(ROOT, "scripts", "run_gpu_tests.py")


def _script():
    spec = importlib.util.spec_from_file_location("run_gpu_tests", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_plan_deals_kernel_rows_and_keeps_the_rest_together():
    rows = [f"tests/test_kernels.py::test_kernel_row[r{i}]" for i in range(7)]
    rest = ["tests/test_gpu_e2e.py::test_a", "tests/test_spec_decode.py::test_b"]
    groups = _script().plan(rows[:3] + rest + rows[3:], 3)
    assert groups == [rows[0::3], rows[1::3], rows[2::3], rest]
    assert _script().plan(rest, 4) == [rest]


def test_counts_read_pytest_summaries():
    counts = _script().counts
    assert counts("..F\n1 failed, 2 passed, 3 skipped in 1.0s\n") == {"passed": 2, "failed": 1, "skipped": 3, "errors": 0}
    assert counts("E\n1 passed, 2 errors in 0.1s") == {"passed": 1, "failed": 0, "skipped": 0, "errors": 2}
    assert counts("killed") == {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}


def test_runs_the_selected_gpu_tests(tmp_path):
    """A real run over two GPU tests of different files (skipped without a GPU, run with one), collected
    from those files only (the whole suite's collection was most of the test's time)."""
    out = subprocess.run([sys.executable, SCRIPT, "--shards", "2", "-k", "codes_on_cuda and not nvfp4 or replays",
                          "--log-dir", str(tmp_path), "tests/test_fp8_checkpoints.py", "tests/test_spec_decode.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    res = json.loads(out.stdout)
    assert sum(p["tests"] for p in res["processes"]) == 3 and not res["failed"]
    assert sum(p["passed"] + p["skipped"] for p in res["processes"]) == 3 and out.returncode == 0
    assert len(os.listdir(tmp_path)) == len(res["processes"])
