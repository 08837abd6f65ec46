"""scripts/bench_throughput.py's probe on the real SmolLM2 (CPU engine): the probe decodes while
every other request runs, and nothing is left running or holding KV blocks afterwards."""
from .helpers import load_script


def test_probe_decodes_among_all_others_then_leaves_nothing_behind(smollm2_gguf):
    from pocketcupy import Engine

    bench = load_script("bench_throughput")
    eng = Engine(smollm2_gguf, device="cpu", progress=False, max_num_seqs=4)
    running, real_step = [], eng.step

    def step():
        outs = real_step()
        running.append(eng.stats()["num_running"])
        return outs
    eng.step = step
    others = [[100 + i] * 12 for i in range(3)]
    tpot = bench.probe_tpot(eng, others, [200] * 12, 6)
    assert tpot is not None and tpot > 0
    assert running.count(4) >= 5          # the probe's decode steps ran with all three others
    assert not eng.has_unfinished_requests() and eng.stats()["kv_blocks_used"] == 0
