"""scripts/profile_kernels.py --summarize: ncu's CSV (units mixed, thousands separators, kernel
signatures) summed per kernel name."""
from .helpers import load_script

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
        '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def _row(i, kernel, unit, value, metric="gpu__time_duration.sum"):
    return (f'"{i}","1","python3","h","{kernel}","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"\n')


def _module():
    return load_script("profile_kernels")


def test_summarize_sums_per_kernel(tmp_path):
    mod = _module()
    gemv = "gemv_gguf_f32_xs<12, 1, 2, false>(const unsigned char *, long, int, int, const float *, float *)"
    csv = tmp_path / "step.csv"
    csv.write_text("==PROF== Connected to process 1\n" + HEAD + _row(0, gemv, "usecond", "12.5")
                   + _row(1, "rms_norm_f32", "nsecond", "2,500") + _row(2, gemv, "msecond", "0.0075"))
    got = mod.summarize(str(csv), top=10)
    assert got["launches"] == 3 and got["kernel_us_total"] == 22.5
    assert got["kernels"][0] == {"name": "gemv_gguf_f32_xs<12, 1, 2, false>", "launches": 2, "us": 20.0,
                                 "share": round(20 / 22.5, 3)}
    assert got["kernels"][1]["name"] == "rms_norm_f32" and got["kernels"][1]["us"] == 2.5


def test_summarize_dram_bytes_give_bandwidth(tmp_path):
    csv = tmp_path / "step.csv"
    csv.write_text(HEAD + _row(0, "k", "usecond", "10") + _row(0, "k", "Mbyte", "20", "dram__bytes_read.sum")
                   + _row(1, "k", "usecond", "10") + _row(1, "k", "Kbyte", "20,000", "dram__bytes_read.sum"))
    got = _module().summarize(str(csv), top=10)
    assert got["launches"] == 2 and got["dram_MB_total"] == 40.0
    assert got["kernels"] == [{"name": "k", "launches": 2, "us": 20.0, "share": 1.0, "MB": 40.0, "GBps": 2000.0}]


def test_sequence_lists_launches_in_order(tmp_path):
    csv = tmp_path / "step.csv"
    csv.write_text(HEAD + _row(0, "norm", "usecond", "4") + _row(0, "norm", "Kbyte", "32", "dram__bytes_read.sum")
                   + _row(1, "gemv<12>(int)", "usecond", "20") + _row(1, "gemv<12>(int)", "Mbyte", "60",
                                                                      "dram__bytes_read.sum")
                   + _row(2, "attn", "nsecond", "6,500"))
    got = _module().sequence(str(csv), 1, 5)
    assert got == [{"name": "gemv<12>", "us": 20.0, "MB": 60.0, "GBps": 3000.0}, {"name": "attn", "us": 6.5}]


def test_profiled_prefill_step_prefills_fresh_prompts(smollm2_gguf):
    """--prefill profiles one step: after the warm-up prefill of the same shape, the profiled prompts
    share no cached prefix with it and all of them are prefilled (and sampled) in that one step."""
    mod = _module()
    eng = mod.make_engine(smollm2_gguf, 2, 48, device="cpu")
    mod.add_greedy(eng, 2, 48, 1)
    while eng.has_unfinished_requests():
        eng.step()
    ids = mod.add_greedy(eng, 2, 48, 1, first=20100)
    outs = eng.step()
    assert sorted(o.request_id for o in outs) == ids == ["r20100_0", "r20100_1"]
    assert all(o.finished and o.num_cached_tokens == 0 and len(o.outputs[0].token_ids) == 1 for o in outs)
    assert not eng.has_unfinished_requests()


def test_profiled_decode_fits_its_small_kv_pool(smollm2_gguf):
    """The profiled engine's pool holds only its requests (ncu saves and restores all of it around
    each kernel), yet the decode set-up runs: every request prefilled and decoding, none preempted."""
    mod = _module()
    eng = mod.make_engine(smollm2_gguf, 3, 40, device="cpu")
    assert eng.stats()["kv_blocks_total"] < 64
    mod.start_decodes(eng, 3, 40, 2)
    st = eng.stats()
    assert st["num_running"] == 3 and st["num_preemptions"] == 0
