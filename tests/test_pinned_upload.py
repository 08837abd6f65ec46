"""backend/pinned_upload.py: every upload arrives intact, through slot reuse and growth, on two
streams, and while a kernel queued before it still reads the slot it overwrites."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_uploads_survive_slot_reuse_and_growth():
    import cupy as cp

    from pocketcupy.backend.pinned_upload import MIN_SLOT_BYTES, RING_SLOTS, upload

    rng = np.random.default_rng(0)
    sizes = [3, 1, MIN_SLOT_BYTES // 4 + 5, 17, 0, 4 * MIN_SLOT_BYTES, 2] * RING_SLOTS
    side = cp.cuda.Stream(non_blocking=True)
    for i, n in enumerate(sizes):
        a = rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32).reshape(-1, 1)
        with side if i % 3 == 0 else cp.cuda.Stream.null:
            d = upload(a)
            assert d.shape == a.shape and d.dtype == a.dtype
            np.testing.assert_array_equal(cp.asnumpy(d), a)


def test_upload_waits_for_kernels_that_read_the_slot():
    """The copy into a reused slot is queued behind the reads of its earlier contents."""
    import cupy as cp

    from pocketcupy.backend.pinned_upload import RING_SLOTS, upload

    big = cp.random.standard_normal(1 << 24, dtype=cp.float32)
    sums = []
    for i in range(3 * RING_SLOTS):
        d = upload(np.full(1024, i, np.float32))
        big.sum()                       # a long kernel between the upload and its reader
        sums.append(d.sum())            # reads the slot after the long kernel
    assert [float(s) for s in sums] == [1024.0 * i for i in range(3 * RING_SLOTS)]
