"""OpenAI-compatible server: `python scripts/serve.py [--model M] [--host H] [--port P] ...`.

Engine flags mirror EngineArgs (also read from POCKETCUPY_* variables); the API key comes from
--api-key or POCKETCUPY_API_KEY. Runs gunicorn in-process with one gthread worker; the model is
loaded in the worker, GET /ready answers 200 once it is.

--tensor-parallel-size N: the worker is rank 0 and starts ranks 1..N-1 (one GPU each; processes on the
CPU); /ready waits for all of them, any rank's death stops the server (exit code 1, the rank named in the log),
SIGTERM / SIGINT stop every rank.
"""
import argparse
import dataclasses
import errno
import importlib.util
import logging
import os
import socket
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _set_compute_threads(argv) -> None:
    """--threads must reach the BLAS library before NumPy is imported."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=None)
    ns, _ = pre.parse_known_args(argv)
    if ns.threads is not None and ns.threads >= 1:
        for var in BLAS_VARS:
            os.environ[var] = str(ns.threads)


def parser() -> argparse.ArgumentParser:
    from pocketcupy.args import EngineArgs
    from pocketcupy.model_cache import DEFAULT_NAME
    from pocketcupy.server.reasoning import PARSERS
    from pocketcupy.server.state import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_REQUEST_BYTES

    ap = argparse.ArgumentParser(prog="serve.py", description=__doc__)
    s = ap.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    s.add_argument("--port", type=int, default=8000, help="default 8000")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (env POCKETCUPY_API_KEY)")
    s.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use as 'model' (default: --model as given, or " + DEFAULT_NAME + ")")
    s.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the NumPy backend's BLAS (default: the library's choice, all cores)")
    s.add_argument("--http-threads", type=int, default=None,
                   help="HTTP threads = requests served at once, streams included (default 2 x max_num_seqs, >= 64)")
    s.add_argument("--graceful-timeout", type=int, default=30,
                   help="seconds in-flight requests get after SIGTERM (default 30)")
    s.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                   help="larger bodies get 413 (default 8 MiB)")
    s.add_argument("--client-timeout", type=int, default=30,
                   help="seconds a client may stall sending a request: mid-body it gets 408, mid-headers the "
                        "connection is dropped; or reading its response: dropped (default 30)")
    s.add_argument("--reasoning-parser", default=None, choices=PARSERS,
                   help="chat: the <think> block of a thinking model's reply goes to 'reasoning_content' "
                        "(qwen3: when the reply opens one; deepseek_r1: the reply starts inside it). Default: none")
    s.add_argument("--chat-template", default=None,
                   help="a Jinja chat template used instead of the model's: a file, or the template itself (vLLM's)")
    s.add_argument("--responses-store", type=int, default=0,
                   help="keep the last N responses of the Responses API (store: true), in memory, for "
                        "previous_response_id and GET /v1/responses/ID (default 0: none)")
    s.add_argument("--files-dir", default=None,
                   help="the folder of the Files API's files (/v1/files; batch inputs and outputs), kept across "
                        "restarts (default: a temporary folder, removed when the server stops)")
    s.add_argument("--max-file-bytes", type=int, default=DEFAULT_MAX_FILE_BYTES,
                   help="larger uploads to /v1/files get 413 (default 512 MiB)")
    s.add_argument("--exclude-tools-when-tool-choice-none", action="store_true",
                   help="chat: leave the tools out of the prompt of a request with tool_choice 'none' (vLLM's; "
                        "by default they stay in it, as OpenAI keeps them: the model just may not call them)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default info")
    s.add_argument("--access-log", action="store_true", help="log every HTTP request")
    s.add_argument("--startup-delay", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: /ready stays 503
    EngineArgs.add_cli_args(ap.add_argument_group("engine"))
    return ap


def read_chat_template(arg: str) -> str:
    """--chat-template: a file's text, or the argument itself when it is a template (chat_template.py's
    load_chat_template: a missing file is an error, not template text); checked for Jinja syntax."""
    from pocketcupy.chat_template import load_chat_template

    return load_chat_template(arg, "--chat-template")


def check_address(host: str, port: int) -> None:
    """The address must be free before the server starts: on one in use gunicorn logged a failed bind a
    second for 5 s, then exited 1. Bound as gunicorn binds (SO_REUSEADDR), then let go."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ValueError(f"host: cannot listen on {host!r}: {e.strerror}") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            field = "host" if e.errno == errno.EADDRNOTAVAIL else "port"  # not this machine's address
            raise ValueError(f"{field}: cannot listen on {host}:{port}: {e.strerror}") from None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _set_compute_threads(argv)
    sys.path.insert(0, ROOT)
    from pocketcupy.args import EngineArgs
    from pocketcupy.server.state import ServerConfig

    ns = parser().parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args = EngineArgs.from_cli(ns)
        given = args.model  # from --model or POCKETCUPY_MODEL
        if args.model is None:
            from pocketcupy.model_cache import default_model_path
            args = dataclasses.replace(args, model=default_model_path(args.cache_dir))
        elif not os.path.exists(args.model):
            raise ValueError(f"model: {args.model} does not exist")
        chat_template = None if ns.chat_template is None else read_chat_template(ns.chat_template)
        if ns.responses_store < 0:
            raise ValueError(f"responses_store: must be >= 0, got {ns.responses_store}")
        if ns.files_dir is not None:
            try:
                os.makedirs(ns.files_dir, exist_ok=True)
            except OSError as e:
                raise ValueError(f"files_dir: cannot make {ns.files_dir}: {e.strerror}") from None
            if not os.access(ns.files_dir, os.W_OK | os.X_OK):
                raise ValueError(f"files_dir: cannot write in {ns.files_dir}")
        for name in ("port", "max_request_bytes", "max_file_bytes", "client_timeout", "threads", "http_threads",
                     "graceful_timeout"):
            v = getattr(ns, name)
            if v is not None and v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v}")
        if ns.port > 65535:
            raise ValueError(f"port: must be at most 65535, got {ns.port}")
        check_address(ns.host, ns.port)
        if args.device == "cuda" and importlib.util.find_spec("cupy") is None:  # CUDA is first touched after the fork
            from pocketcupy.backend import NO_CUDA
            raise ValueError(f"device: 'cuda' requested but {NO_CUDA}")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from pocketcupy.model_cache import DEFAULT_NAME

    names = ns.served_model_name or [given or DEFAULT_NAME]
    api_key = ns.api_key or os.environ.get("POCKETCUPY_API_KEY") or None
    host = f"[{ns.host}]" if ":" in ns.host else ns.host
    config = ServerConfig(engine_args=args, served_model_names=names, api_key=api_key,
                          max_request_bytes=ns.max_request_bytes, client_timeout_s=ns.client_timeout,
                          url=f"http://{host}:{ns.port}", startup_delay=ns.startup_delay,
                          reasoning_parser=ns.reasoning_parser, chat_template=chat_template,
                          responses_store=ns.responses_store, files_dir=ns.files_dir,
                          max_file_bytes=ns.max_file_bytes,
                          exclude_tools_when_tool_choice_none=ns.exclude_tools_when_tool_choice_none)
    http_threads = ns.http_threads or max(64, 2 * args.max_num_seqs)
    options = {"bind": f"{host}:{ns.port}", "threads": http_threads, "timeout": 120,
               "graceful_timeout": ns.graceful_timeout, "keepalive": 5, "loglevel": ns.log_level,
               "accesslog": "-" if ns.access_log else None, "worker_connections": max(1000, http_threads * 2)}
    from pocketcupy.server.gunicorn_app import ServeApplication

    ServeApplication(config, options).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
