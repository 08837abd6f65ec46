"""OpenAI-compatible server: `python scripts/serve.py [--model M] [--host H] [--port P] ...`.

Engine flags mirror EngineArgs (also read from POCKETCUPY_* variables); the API key comes from
--api-key or POCKETCUPY_API_KEY. Runs gunicorn in-process with one gthread worker.
"""
import argparse
import dataclasses
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from pocketcupy.args import EngineArgs  # noqa: E402
from pocketcupy.server.state import DEFAULT_MAX_REQUEST_BYTES, ServerConfig  # noqa: E402

DEFAULT_NAME = "SmolLM2-135M-Instruct"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="serve.py", description=__doc__,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    s = ap.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (env POCKETCUPY_API_KEY)")
    s.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use as 'model' (default: --model as given, or " + DEFAULT_NAME + ")")
    s.add_argument("--threads", type=int, default=None,
                   help="HTTP threads of the worker = open requests it can serve at once (default 2 x max_num_seqs, >= 64)")
    s.add_argument("--graceful-timeout", type=int, default=30, help="seconds in-flight requests get after SIGTERM")
    s.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES, help="larger bodies get 413")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument("--access-log", action="store_true", help="log every HTTP request")
    s.add_argument("--startup-delay", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: /ready stays 503
    EngineArgs.add_cli_args(ap.add_argument_group("engine"))
    return ap


def main(argv=None) -> int:
    ns = parser().parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args = EngineArgs.from_cli(ns)
        if args.model is None:
            from pocketcupy.model_cache import default_model_path
            args = dataclasses.replace(args, model=default_model_path(args.cache_dir))
        elif not os.path.exists(args.model):
            raise ValueError(f"model: {args.model} does not exist")
        for name in ("port", "max_request_bytes", "threads"):
            v = getattr(ns, name)
            if v is not None and v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v}")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    names = ns.served_model_name or [ns.model or DEFAULT_NAME]
    api_key = ns.api_key or os.environ.get("POCKETCUPY_API_KEY") or None
    host = f"[{ns.host}]" if ":" in ns.host else ns.host
    config = ServerConfig(engine_args=args, served_model_names=names, api_key=api_key,
                          max_request_bytes=ns.max_request_bytes, url=f"http://{host}:{ns.port}",
                          startup_delay=ns.startup_delay)
    threads = ns.threads or max(64, 2 * args.max_num_seqs)
    options = {"bind": f"{host}:{ns.port}", "threads": threads, "timeout": 120,
               "graceful_timeout": ns.graceful_timeout, "keepalive": 5, "loglevel": ns.log_level,
               "accesslog": "-" if ns.access_log else None, "worker_connections": max(1000, threads * 2)}
    from pocketcupy.server.gunicorn_app import ServeApplication

    ServeApplication(config, options).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
