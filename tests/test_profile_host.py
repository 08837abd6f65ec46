"""scripts/profile_host.py on the real SmolLM2 (CPU): the engine's step calls the sampler through
`launch` (async scheduling's split), which the script's timing wrapper must follow."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_profile_host_reports_the_host_share_of_a_decode_step(smollm2_gguf):
    out = subprocess.run([sys.executable, os.path.join(HERE, "..", "scripts", "profile_host.py"), "--model",
                          smollm2_gguf, "--requests", "2", "--tokens", "4", "--prompt-len", "8", "--top", "40"],
                         capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(out.stdout)
    assert got["decode_steps"] == 3 and got["profiled_steps"] == 2
    assert 0 < got["host_ms_per_step"] < got["step_ms"]
    assert got["model_ms"] > 0 and got["sampler_array_ms"] > 0
    functions = [f["function"] for f in got["top_functions"]]
    assert any("engine.py" in f and "(step)" in f for f in functions)
    assert any("sampler.py" in f and "(launch)" in f for f in functions)
