import os
import sys

# Before anything imports NumPy: OpenBLAS's worker threads spin-wait, and on a small shared CPU
# quota a 2-thread GEMM of a decode step runs ~20x slower than a 1-thread one (the CPU suite
# took 4x longer). Override by setting OPENBLAS_NUM_THREADS yourself.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line("markers", "slow: long-running")


def pytest_collection_modifyitems(config, items):
    from pocketcupy.backend import cuda_available

    if cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    """Path of the real SmolLM2-135M-Instruct GGUF (downloaded once into the cache)."""
    from pocketcupy.model_cache import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_gguf):
    """One CPU Engine of SmolLM2 with the default settings, shared by the modules that need no others
    (each module built its own: seconds of loading apiece). Tests leave it idle and as they found it."""
    from pocketcupy import Engine

    return Engine(smollm2_gguf, device="cpu", progress=False)
