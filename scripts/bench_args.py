"""The model benchmarks' shared argument checks: counts given on the command line, the device, and an
engine whose model path or settings are refused as a usage error (exit 2), not a traceback."""
import argparse
import os
import sys


def count(minimum: int = 1):
    """An argparse type: an integer of at least `minimum`."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    parse.__name__ = "count"
    return parse


def require_gpu(ap: argparse.ArgumentParser, does: str) -> None:
    """A script that only runs on CUDA, on a machine without a usable GPU: one line saying so, exit 2."""
    from pocketcupy.backend import NO_CUDA, cuda_available

    if not cuda_available():
        ap.exit(2, f"{ap.prog}: {does}, but {NO_CUDA}\n")


def device(ap: argparse.ArgumentParser, name: str) -> str:
    """--device resolved ('auto': CUDA where a GPU is present); 'cuda' without one is a usage error."""
    from pocketcupy.backend import resolve_device

    try:
        return resolve_device(name)
    except ValueError as e:
        ap.error(str(e))


def engine(ap: argparse.ArgumentParser | None, model: str, **kwargs):
    """Engine(model, **kwargs); its ValueError (no such model, a setting it refuses) is a usage error
    of `ap` (where given)."""
    from pocketcupy import Engine

    try:
        return Engine(model, **kwargs)
    except ValueError as e:
        if ap is None:
            raise
        ap.error(str(e))


if __name__ == "__main__":
    sys.exit(f"{os.path.basename(__file__)}: a module the benchmark scripts import, not a script to run")
