"""Engine(tensor_parallel_size=N) end to end on the CPU: worker ranks in their own processes,
the CPU communicator between them. Greedy tokens equal one rank's (SmolLM2 at 2 and 3 ranks,
transformers' on the tiny HF fixtures at 2 and 4 ranks, an odd vocabulary), and failures (a bad
size, a rank that cannot load, a killed rank) end in a clear error naming the rank, not a hang."""
import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest

from pocketcupy import Engine, EngineArgs, SamplingParams
from pocketcupy.dist import RankFailedError
from pocketcupy.dist.group import RankGroup
from pocketcupy.loader import load_checkpoint

from .conftest import FIXTURES
from .test_synthetic_model import _script

PROMPTS = ["The capital of France is", "def fib(n):", "Once upon a time"]
PARAMS = SamplingParams(temperature=0, max_tokens=12, logprobs=3, prompt_logprobs=2)
HF = np.load(os.path.join(FIXTURES, "hf_logits.npz"))


def engine(path, tp, **kw):
    return Engine(path, device="cpu", progress=False, tensor_parallel_size=tp, **kw)


def max_logprob_gap(a, b) -> float:
    """Largest difference of a logprob both outputs report (sampled tokens and prompt tokens)."""
    gaps = [0.0]
    for x, y in zip(a.outputs[0].logprobs + a.prompt_logprobs[1:], b.outputs[0].logprobs + b.prompt_logprobs[1:]):
        gaps += [abs(x[t].logprob - y[t].logprob) for t in x.keys() & y.keys()]
    return max(gaps)


def assert_same_generation(path, tp, reference, prompts=PROMPTS, params=PARAMS, max_gap=1e-3):
    eng = engine(path, tp)
    try:
        assert eng.ranks.world == tp and len(eng.ranks.procs) == tp - 1
        outs = eng.generate(prompts, params)
    finally:
        eng.close()
    for ref, out in zip(reference, outs):
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        assert max_logprob_gap(ref, out) < max_gap   # partial sums in another order: float rounding only
    assert all(p.exitcode == 0 for p in eng.ranks.procs.values())


@pytest.fixture(scope="module")
def smollm2_reference(smollm2_gguf):
    return engine(smollm2_gguf, 1).generate(PROMPTS, PARAMS)


@pytest.mark.parametrize("tp", [2, 3])
def test_smollm2_greedy_equals_one_rank(smollm2_gguf, smollm2_reference, tp):
    """9 heads / 3 KV heads: 2 ranks hold 6 + 3 query heads (2 + 1 KV groups), 3 ranks 3 each."""
    assert_same_generation(smollm2_gguf, tp, smollm2_reference)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen2", "tiny_qwen3"])
def test_hf_fixtures_greedy_equals_transformers(name, tp):
    """Llama-3 rope scaling, Qwen2 QKV bias, Qwen3 q/k norm + tied embeddings; at 4 ranks each of
    the 2 KV heads is replicated on 2 ranks."""
    eng = engine(os.path.join(FIXTURES, name), tp)
    try:
        want = HF[f"{name}__greedy_ids"].tolist()
        out = eng.generate(HF[f"{name}__greedy_prompt"].tolist(),
                           SamplingParams(temperature=0, max_tokens=len(want), ignore_eos=True))[0]
    finally:
        eng.close()
    assert out.outputs[0].token_ids == want


@pytest.fixture(scope="module")
def odd_vocab(tmp_path_factory):
    """Vocabulary 515 (shards of 258 + 257 rows, the second padded), 6 heads / 3 KV heads."""
    out = str(tmp_path_factory.mktemp("odd_vocab"))
    return _script().main(["--out", out, "--vocab", "515", "--hidden", "96", "--layers", "2", "--heads", "6",
                           "--kv-heads", "3", "--intermediate", "192", "--formats", "q8_0,bf16", "--seed", "3"])


@pytest.mark.parametrize("fmt", ["q8_0", "bf16"])
def test_odd_vocabulary_and_uneven_heads(odd_vocab, fmt):
    path = odd_vocab["formats"][fmt]["path"]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    prompts = ["the cat sat", "hello world, this is"]
    assert_same_generation(path, 2, engine(path, 1).generate(prompts, params), prompts, params)


def test_sizes_that_do_not_split_are_refused_before_any_rank_starts(smollm2_gguf):
    before = set(mp.active_children())
    with pytest.raises(ValueError, match="tensor_parallel_size: 4 ranks cannot share the model's 3 KV heads"):
        engine(smollm2_gguf, 4)
    assert set(mp.active_children()) == before
    with pytest.raises(ValueError, match="tensor_parallel_size: must be a positive integer"):
        EngineArgs(tensor_parallel_size=0)
    assert EngineArgs.from_env({"POCKETCUPY_TENSOR_PARALLEL_SIZE": "3"}).tensor_parallel_size == 3


def test_a_rank_that_cannot_load_is_named():
    cfg = load_checkpoint(os.path.join(FIXTURES, "tiny_llama")).config
    group = RankGroup(EngineArgs(model="/nonexistent/model.gguf", device="cpu", tensor_parallel_size=4,
                                 progress=False), cfg)
    try:
        with pytest.raises(RankFailedError, match=r"rank [123] failed: ValueError: model: /nonexistent/model.gguf "
                                                  r"does not exist \(pid \d+\)"):
            group.agree_num_blocks(100)
    finally:
        group.close()
    assert all(not p.is_alive() for p in group.procs.values())


def test_a_rank_killed_while_loading_is_named(smollm2_gguf):
    def kill_first_rank():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ranks = [p for p in mp.active_children() if p.name == "pocketcupy-rank1"]
            if ranks:
                os.kill(ranks[0].pid, signal.SIGKILL)
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_first_rank)
    killer.start()
    try:
        with pytest.raises(RankFailedError, match=r"rank 1 failed: killed by signal SIGKILL \(pid \d+\)"):
            engine(smollm2_gguf, 3)
    finally:
        killer.join()
    assert not [p for p in mp.active_children() if p.name.startswith("pocketcupy-rank")]


@pytest.mark.parametrize("when", ["idle", "mid-step"])
def test_a_killed_rank_fails_the_engine_within_seconds(when):
    eng = engine(os.path.join(FIXTURES, "tiny_llama"), 4)
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    eng.generate("hi", SamplingParams(max_tokens=2))
    victim = eng.ranks.procs[2]
    t0 = time.monotonic()
    if when == "idle":
        os.kill(victim.pid, signal.SIGKILL)
        while eng.ranks.failure is None and time.monotonic() - t0 < 10:   # the monitor notices by itself
            time.sleep(0.01)
    else:
        threading.Timer(0.3, os.kill, (victim.pid, signal.SIGKILL)).start()
    with pytest.raises(RankFailedError, match=r"tensor-parallel rank 2 failed: killed by signal SIGKILL") as err:
        eng.generate(["a long story", "another one"], params)
    assert err.value.rank == 2 and time.monotonic() - t0 < 10
    assert all(not p.is_alive() for p in eng.ranks.procs.values())      # the other ranks were stopped, reaped
    with pytest.raises(RankFailedError):
        eng.generate("hi", params)
    eng.close()


UNGUARDED_SCRIPT = """
import json, sys
from pocketcupy import Engine, SamplingParams
eng = Engine(sys.argv[1], device="cpu", progress=False, tensor_parallel_size=2)
params = SamplingParams(temperature=0, max_tokens=40, structured_outputs={"json": json.loads(sys.argv[2])})
print(json.dumps(eng.chat([{"role": "user", "content": "The capital of France as JSON."}], params)[0].outputs[0].text))
eng.close()
"""


def test_a_script_without_main_guard_with_structured_output(smollm2_gguf, tmp_path):
    """multiprocessing's spawn would re-run a plain script in every rank; ranks start without it.
    The constrained answer at 2 ranks is one rank's answer."""
    import json
    import subprocess
    import sys

    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}
    script = tmp_path / "plain.py"
    script.write_text(UNGUARDED_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")}
    run = subprocess.run([sys.executable, str(script), smollm2_gguf, json.dumps(schema)], capture_output=True,
                         text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    params = SamplingParams(temperature=0, max_tokens=40, structured_outputs={"json": schema})
    one = engine(smollm2_gguf, 1).chat([{"role": "user", "content": "The capital of France as JSON."}], params)
    assert json.loads(run.stdout.strip().splitlines()[-1]) == one[0].outputs[0].text
    assert json.loads(one[0].outputs[0].text)["city"]
