"""The fixture scripts' reference implementations (torch and transformers, llama-cpp-python) are not
project dependencies: without one, a script says what to install in one line instead of a traceback."""
import importlib
import os
import sys

HF = "pip install torch transformers, e.g. in a throwaway venv"
LLAMA_CPP = 'CMAKE_ARGS="-DGGML_NATIVE=off" pip install llama-cpp-python'


def need(module: str, install: str):
    """The module, or exit 1 naming it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        sys.exit(f"{os.path.basename(sys.argv[0])}: error: needs {module}, which is not a project dependency "
                 f"(only for regenerating fixtures): {install}")


if __name__ == "__main__":
    sys.exit(f"{os.path.basename(__file__)}: a module the fixture scripts import, not a script to run")
