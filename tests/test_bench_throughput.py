"""scripts/bench_throughput.py on the real SmolLM2 (CPU engine): the probe decodes while every other
request runs, and nothing is left running or holding KV blocks afterwards; small levels pool repeats."""
import pytest

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


def test_small_levels_pool_their_repeats(smollm2_gguf, capsys):
    """Levels of at most 16 requests run --repeats times: one JSON object whose per-level figures pool
    every run (here over an int8 KV cache); --repeats 0 is a usage error."""
    import json

    bench = load_script("bench_throughput")
    bench.main([smollm2_gguf, "--device", "cpu", "--concurrency", "1", "2", "--prompt", "8", "--output", "4",
                "--prefix-tokens", "0", "--repeats", "2", "--kv-cache-dtype", "int8"])
    res = json.loads(capsys.readouterr().out)
    assert res["kv_cache_dtype"] == "int8"
    assert [res["runs"][c]["repeats"] for c in ("1", "2")] == [2, 2]
    one = res["runs"]["1"]
    assert one["output_tok_s"] > 0 and one["ttft_p50_ms"] <= one["ttft_p99_ms"] and one["tpot_p50_ms"] > 0
    assert res["probe"]["others"] == 1
    with pytest.raises(SystemExit):
        bench.main([smollm2_gguf, "--device", "cpu", "--repeats", "0"])


def test_prefix_ttft_is_a_median_of_fresh_prefixes(smollm2_gguf, capsys):
    """--prefix-tokens: PREFIX_ROUNDS fresh prefixes after a warm-up one, each timed cold and then with
    the prefix cached; the figures are medians and the cached samples are reported."""
    import json

    bench = load_script("bench_throughput")
    bench.main([smollm2_gguf, "--device", "cpu", "--concurrency", "1", "--prompt", "8", "--output", "2",
                "--prefix-tokens", "96", "--repeats", "1"])
    res = json.loads(capsys.readouterr().out)
    pre = res["prefix"]
    assert pre["tokens"] == 96 and pre["rounds"] == bench.PREFIX_ROUNDS == len(pre["ttft_cached_samples_ms"])
    assert sorted(pre["ttft_cached_samples_ms"])[bench.PREFIX_ROUNDS // 2] == pre["ttft_cached_ms"]
    assert pre["ttft_cached_ms"] < pre["ttft_cold_ms"]                 # 32 new tokens against 128
    assert res["stats"]["prefix_cache_hits"] >= 6 * 96 // 16           # every round's cached request hit its prefix
