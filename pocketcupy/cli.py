"""`python -m pocketcupy generate "..."`, `chat`, `embed "..."` and `run-batch -i IN.jsonl -o OUT.jsonl`."""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time

from .args import EngineArgs
from .pooling import POOLING_TYPES, PoolingParams, default_pooling_type
from .sampling import SamplingParams
from .server.reasoning import PARSERS


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256, help="default 256")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="default 0: greedy (these flags are the command's own defaults, not the model's "
                        "recommended ones)")
    p.add_argument("--top-p", type=float, default=1.0, help="default 1: off")
    p.add_argument("--top-k", type=int, default=0, help="default 0: off")
    p.add_argument("--min-p", type=float, default=0.0, help="default 0: off")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="default 1: off")
    p.add_argument("--sampling-seed", type=int, default=None, help="per-request sampling seed (default: none)")


def _params(ns) -> SamplingParams:
    return SamplingParams(max_tokens=ns.max_tokens, temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k,
                          min_p=ns.min_p, repetition_penalty=ns.repetition_penalty, seed=ns.sampling_seed)


def _stream(engine, prompt, params) -> str:
    """Print the reply as it is produced, then time to first token and decode speed. Ctrl-C stops it
    between two steps (a KeyboardInterrupt inside one would leave the engine half-way): the request is
    aborted and KeyboardInterrupt raised."""
    rid = f"cli-{time.monotonic_ns()}"
    if isinstance(prompt, list):  # chat messages
        prompt = engine.tokenizer.encode(engine.render_chat(prompt), add_special_tokens=False)
    engine.add_request(rid, prompt, params)
    t0, first, text, n = time.monotonic(), None, [], 0
    done, stop = False, []
    old = signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    try:
        while not done and not stop:
            for out in engine.step():
                if out.request_id != rid:
                    continue
                o = out.outputs[0]
                if first is None and o.delta_token_ids:
                    first = time.monotonic()
                n += len(o.delta_token_ids)
                text.append(o.delta_text)
                sys.stdout.write(o.delta_text)
                sys.stdout.flush()
                done = out.finished
    finally:
        signal.signal(signal.SIGINT, old)
    sys.stdout.write("\n")
    if stop and not done:
        engine.abort_request(rid)
        print("[interrupted]", file=sys.stderr)
        raise KeyboardInterrupt
    end = time.monotonic()
    first = first or end
    rate = (n - 1) / (end - first) if n > 1 and end > first else 0.0
    print(f"[{n} tokens; first token after {(first - t0) * 1e3:.0f} ms; {rate:.1f} tok/s]", file=sys.stderr)
    return "".join(text)


def main(argv=None) -> int:
    """Ctrl-C (outside a reply, which it stops) ends the command with exit code 130, as a shell's, with no
    traceback; a closed stdout, with exit code 1."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:   # stdout's reader went away (`| head`): quietly, as Python's docs do it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # (the flush at exit fails too)
        return 1


def _main(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m pocketcupy")
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="complete a prompt")
    g.add_argument("prompt")
    c = sub.add_parser("chat", help="chat interactively (or answer --message once)")
    c.add_argument("--message", "-m", default=None, help="one user message; omit for an interactive chat")
    c.add_argument("--system", default=None, help="a system message before the conversation")
    e = sub.add_parser("embed", help="embed texts: one JSON line each, {\"text\", \"tokens\", \"embedding\"}")
    e.add_argument("texts", nargs="+")
    e.add_argument("--pooling", choices=POOLING_TYPES, default=None, help="default: the model's own, else last")
    e.add_argument("--no-normalize", action="store_true", help="keep the vector's length")
    b = sub.add_parser("run-batch", help="answer a file of requests in the OpenAI Batch API's format (JSONL: chat, "
                                         "completions, embeddings, responses, score, rerank), as vLLM's run_batch")
    b.add_argument("-i", "--input-file", required=True, help="the requests, a JSON object a line ('-': stdin)")
    b.add_argument("-o", "--output-file", required=True, help="the results, a line each in the input's order "
                                                              "('-': stdout)")
    b.add_argument("--served-model-name", nargs="+", default=None,
                   help="the names requests give as 'model' (default: --model as given, or SmolLM2-135M-Instruct)")
    b.add_argument("--concurrency", type=int, default=None,
                   help="requests in flight at once (default 2 x max_num_seqs, at least 64)")
    b.add_argument("--reasoning-parser", default=None, choices=PARSERS, help="as serve.py's")
    for p in (g, c, e, b):
        EngineArgs.add_cli_args(p)
    for p in (g, c):
        _sampling_args(p)
    ns = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if ns.command == "run-batch":
        return _run_batch(ns)
    try:
        params = None if ns.command == "embed" else _params(ns)  # before the model loads
        from .engine import Engine

        engine = Engine.from_args(EngineArgs.from_cli(ns))
    except (ValueError, OSError) as e:   # OSError: the default model's download, an unreadable file
        print(f"error: {e}", file=sys.stderr)
        return 2
    if ns.command == "embed":
        return _embed(engine, ns)
    if ns.command == "generate":
        try:
            _stream(engine, ns.prompt, params)
        except ValueError as e:  # the request's: an empty prompt, one too long for the context
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    history = [{"role": "system", "content": ns.system}] if ns.system else []
    while True:
        if ns.message is not None:
            text = ns.message
        else:
            try:   # the "> " prompt only for a person typing: piped input gets the replies alone
                text = input("> " if sys.stdin.isatty() else "")
            except EOFError:
                if sys.stdin.isatty():
                    print()   # Ctrl-D at the prompt: the shell's prompt on a line of its own
                return 0
        history.append({"role": "user", "content": text})
        try:
            reply = _stream(engine, history, params)
        except (ValueError, KeyboardInterrupt) as e:
            # ValueError: e.g. the conversation no longer fits the context; Ctrl-C: the reply stopped.
            # The chat goes on without them.
            if isinstance(e, ValueError):
                print(f"error: {e}", file=sys.stderr)
            history.pop()
            if ns.message is not None:
                return 2 if isinstance(e, ValueError) else 130
            continue
        history.append({"role": "assistant", "content": reply})
        if ns.message is not None:
            return 0


def _embed(engine, ns) -> int:
    pooling = PoolingParams(ns.pooling or default_pooling_type(engine.config), normalize=not ns.no_normalize)
    try:
        outs = engine.embed(ns.texts, pooling)
    except ValueError as e:  # an empty text, one too long for the context
        print(f"error: {e}", file=sys.stderr)
        return 2
    for text, out in zip(ns.texts, outs):
        print(json.dumps({"text": text, "tokens": len(out.prompt_token_ids), "embedding": out.outputs.embedding}))
    return 0


def _check_output_file(path: str, input_path: str) -> None:
    """Refuses an output file that cannot be made, or that is the input (opening it erases the requests)."""
    if path == "-":
        return
    if os.path.isdir(path):
        raise ValueError(f"--output-file: {path} is a folder")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"--output-file: there is no folder {folder}")
    if input_path != "-" and os.path.exists(path) and os.path.samefile(path, input_path):
        raise ValueError(f"--output-file: {path} is the --input-file; writing the results would erase the requests")


def _run_batch(ns) -> int:
    from .model_cache import DEFAULT_NAME
    from .server.batch import default_concurrency, run_batch
    from .server.state import ServerConfig, ServerState

    try:
        args = EngineArgs.from_cli(ns)
        if ns.concurrency is not None and ns.concurrency < 1:
            raise ValueError(f"concurrency: must be a positive integer, got {ns.concurrency}")
        # bytes: json.loads decodes each line, so a line that is no UTF-8 is an error line of its own, and a BOM is
        # skipped
        try:
            src = contextlib.nullcontext(sys.stdin.buffer) if ns.input_file == "-" else open(ns.input_file, "rb")
        except OSError as e:
            raise ValueError(f"--input-file: cannot read it: {e}") from None
        _check_output_file(ns.output_file, ns.input_file)   # before the model loads, which may take minutes
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    state = ServerState(ServerConfig(engine_args=args, served_model_names=ns.served_model_name or
                                     [args.model or DEFAULT_NAME], reasoning_parser=ns.reasoning_parser))
    try:
        state.load()
        dst = (contextlib.nullcontext(sys.stdout) if ns.output_file == "-"
               else open(ns.output_file, "w", encoding="utf-8"))
    except Exception as e:  # noqa: BLE001 - the model's failure, or the output file's
        print(f"error: {e}", file=sys.stderr)
        return 3
    t0 = time.monotonic()
    try:
        with src as lines, dst as out:
            def write(line: str, _result: dict) -> None:
                out.write(line)
                out.flush()
            counts = run_batch(state, lines, write, ns.concurrency or default_concurrency(args))
    finally:
        state.shutdown()
    print(json.dumps({**counts, "seconds": round(time.monotonic() - t0, 2)}), file=sys.stderr)
    return 0
