"""The runner's flat batch (FlatBatchBuilder, whole-batch numpy) against a per-request reference,
over random mixes of decode rows, prompt chunks and block tables with spare blocks."""
import numpy as np
import pytest

from pocketcupy.runner import FlatBatchBuilder
from pocketcupy.sched.output import ScheduledRequest, SchedulerOutput


def reference(out: SchedulerOutput, bs: int):
    ids, pos, slots, starts, lens = [], [], [], [0], []
    tables = np.zeros((len(out.scheduled), max(len(s.block_ids) for s in out.scheduled)), np.int32)
    for i, s in enumerate(out.scheduled):
        for j, tok in enumerate(s.token_ids):
            p = s.start_position + j
            ids.append(tok)
            pos.append(p)
            slots.append(s.block_ids[p // bs] * bs + p % bs)
        starts.append(starts[-1] + len(s.token_ids))
        lens.append(s.start_position + len(s.token_ids))
        tables[i, :len(s.block_ids)] = s.block_ids
    return {"ids": np.array(ids, np.int64), "pos": np.array(pos, np.int64),
            "query_start": np.array(starts, np.int32), "seq_lens": np.array(lens, np.int32),
            "block_tables": tables, "slot_mapping": np.array(slots, np.int64)}


def random_batch(rng, decode_only: bool, bs: int) -> SchedulerOutput:
    out = SchedulerOutput()
    for i in range(int(rng.integers(1, 10))):
        start = int(rng.integers(0, 5 * bs))
        n = 1 if decode_only or rng.random() < 0.4 else int(rng.integers(1, 3 * bs))
        blocks = rng.permutation(np.arange(1, 200))[: -(-(start + n) // bs) + int(rng.integers(0, 3))]
        out.scheduled.append(ScheduledRequest(f"r{i}", rng.integers(0, 50000, n).tolist(), start, blocks.tolist(),
                                              sample=True, prompt_logits=False))
    return out


@pytest.mark.parametrize("decode_only", [True, False])
@pytest.mark.parametrize("bs", [1, 16])
def test_flat_batch_equals_per_request_reference(decode_only, bs):
    rng = np.random.default_rng(bs + 2 * decode_only)
    build = FlatBatchBuilder(bs)
    for _ in range(200):
        out = random_batch(rng, decode_only, bs)
        ids, pos, meta = build(out)
        got = {"ids": ids, "pos": pos, "query_start": meta.query_start, "seq_lens": meta.seq_lens,
               "block_tables": meta.block_tables, "slot_mapping": meta.slot_mapping}
        for name, want in reference(out, bs).items():
            assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
            np.testing.assert_array_equal(got[name], want, err_msg=name)
        assert meta.block_size == bs and meta.num_seqs == len(out.scheduled)


def test_token_feed_maps_pending_rows_to_the_previous_samples():
    from pocketcupy.runner import TokenFeed
    from pocketcupy.sched.request import PENDING_TOKEN

    out = SchedulerOutput([ScheduledRequest("a", [5, 6, 7], 0, [1], True, False),
                           ScheduledRequest("b", [PENDING_TOKEN], 9, [2], True, False),
                           ScheduledRequest("c", [PENDING_TOKEN], 4, [3], True, False)])
    ids, _, meta = FlatBatchBuilder(16)(out)
    dst = np.flatnonzero(ids == PENDING_TOKEN).tolist()
    assert dst == [3, 4]
    assert TokenFeed(np.array([11, 22, 33], np.int32), {"c": 0, "b": 2}).rows_for(out, dst, meta.query_start) == [2, 0]
    with pytest.raises(RuntimeError, match="c: a pending token"):
        TokenFeed(np.array([11], np.int32), {"b": 0}).rows_for(out, dst, meta.query_start)
    mid = SchedulerOutput([ScheduledRequest("d", [PENDING_TOKEN, 8], 0, [1], True, False)])
    ids, _, meta = FlatBatchBuilder(16)(mid)
    with pytest.raises(RuntimeError, match="d: a pending token"):
        TokenFeed(np.array([11], np.int32), {"d": 0}).rows_for(mid, [0], meta.query_start)


def test_per_token_rows_compute_what_the_chunks_do():
    """A verification step (each request's last token and its drafts) laid out as sequences of one
    row each (runner.per_token_rows, the decode graphs' layout) gives the logits of the same tokens
    as chunks: every row reads its request's K/V up to its own position, the step's earlier rows
    included."""
    import os

    from pocketcupy.runner import ModelRunner, per_token_rows

    from .conftest import FIXTURES
    from .helpers import load_reference_model

    model, ops = load_reference_model(os.path.join(FIXTURES, "tiny_llama"))
    runner = ModelRunner(model, ops, num_blocks=24, block_size=4)
    rng = np.random.default_rng(5)
    prompts = {"a": rng.integers(0, 256, 21).tolist(), "b": rng.integers(0, 256, 6).tolist()}
    blocks = {"a": [9, 3, 17, 1, 12, 5, 20, 8], "b": [2, 14, 7, 22]}
    runner.execute(SchedulerOutput([ScheduledRequest(r, p, 0, blocks[r], False, False) for r, p in prompts.items()]))
    step = SchedulerOutput([ScheduledRequest(r, rng.integers(0, 256, 1 + k).tolist(), len(prompts[r]), blocks[r],
                                             True, False, num_draft=k) for r, k in (("a", 4), ("b", 3))])
    ids, pos, meta = runner.build_batch(step)
    chunks = runner.execute(step).logits
    rows = per_token_rows(meta, pos)
    assert rows.decode_only and rows.num_seqs == len(ids) == 9
    hidden = model.forward(ops.asarray(ids), ops.asarray(pos), ops.upload_meta(rows), runner.kv_caches)
    np.testing.assert_allclose(model.compute_logits(hidden), chunks, rtol=1e-5, atol=1e-5)
