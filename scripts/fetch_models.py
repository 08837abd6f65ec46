"""Download the default model (SmolLM2-135M-Instruct GGUF) into the cache; print its path last."""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pocketcupy.model_cache import cache_dir, default_model_path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cache-dir", default=None, help="default: $POCKETCUPY_CACHE or ~/.cache/pocketcupy")
    args = ap.parse_args()
    print(f"cache: {cache_dir(args.cache_dir)}")
    try:
        print(default_model_path(args.cache_dir))
    except OSError as e:   # no network, a cache folder that cannot be made
        ap.exit(1, f"fetch_models.py: error: {e}\n")


if __name__ == "__main__":
    main()
