"""The flask app: routes, API-key check, body limits, and OpenAI error bodies for every failure."""
from __future__ import annotations

import contextlib
import hmac
import json
import logging
import uuid

from flask import Flask, Response, request, send_file
from werkzeug.exceptions import HTTPException
from werkzeug.routing import PathConverter

from .. import __version__
from . import batches_api, files_api
from .anthropic_api import handle_count_tokens, handle_messages
from .chat import handle_chat
from .completions import handle_completion
from .embeddings import handle_embeddings
from .responses_api import handle_input_tokens, handle_responses
from .responses_background import cancelled, resumed
from .responses_items import item_page
from .scoring import handle_rerank, handle_score
from .tokenize import handle_detokenize, handle_tokenize
from .generation import GONE_STATUS, ClientGone, disconnect_probe
from .protocol import ApiError
from .responses import json_bytes
from .sse import SSEStream
from .state import PROBES

log = logging.getLogger("pocketcupy.server")


def _json(obj, status: int = 200) -> Response:
    return Response(json_bytes(obj), status=status, mimetype="application/json")


class _ModelIdConverter(PathConverter):
    """A model id as the rest of the path, slashes included, a leading one too: the default served name is
    the --model path, and the openai client's models.retrieve('/abs/model.gguf') asks for
    /v1/models/%2Fabs%2Fmodel.gguf, which reaches the app as /v1/models//abs/model.gguf (werkzeug's
    path converter refuses the leading slash; its redirect to the merged slashes lost it: a 404)."""
    regex = ".+"
    part_isolating = False   # (werkzeug infers True from a regex without '/')


def _no_constants(name):
    raise ValueError(f"{name} is not valid JSON")


@contextlib.contextmanager
def _stall_timeout(stall_s: float):
    """Reading the request body: a client that stalls mid-body `stall_s` seconds gets a 408. (gunicorn reads
    the body on a blocking socket without a timeout: a client that stalled held an HTTP thread for good, and
    as many of them as --http-threads blocked every route.)"""
    sock = request.environ.get("gunicorn.socket")
    if sock is not None:
        sock.settimeout(stall_s)
    try:
        yield
    except Exception as e:  # gunicorn closes the connection: the body was not read to its end
        # (an upload's multipart parser, werkzeug's, turns the socket's timeout into a ClientDisconnected)
        if isinstance(e, TimeoutError) or isinstance(e.__context__, TimeoutError):
            raise ApiError(408, f"no request body data for {stall_s:g} s", code="request_timeout") from None
        raise
    finally:
        if sock is not None:
            sock.settimeout(None)


def _body(limit: int, stall_s: float) -> dict:
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ("", "identity"):  # was read as JSON as it came: a 400 about invalid UTF-8
        raise ApiError(415, f"Content-Encoding '{encoding}' is not supported: send the body uncompressed",
                       code="unsupported_content_encoding")
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, f"request body of {request.content_length} bytes exceeds the limit of {limit} bytes")
    stream, parts, size = request.environ["wsgi.input"], [], 0  # the server ends it (Content-Length/chunked)
    with _stall_timeout(stall_s):
        try:
            while chunk := stream.read(1 << 16):
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"request body exceeds the limit of {limit} bytes")
                parts.append(chunk)
        except (ApiError, TimeoutError):
            raise
        except Exception as e:  # noqa: BLE001 - bad chunked framing (gunicorn's own exception types), the client gone
            raise ApiError(400, f"the request body could not be read: {type(e).__name__}: {e}",
                           code="invalid_body") from None
    raw = b"".join(parts)
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"We could not parse the JSON body of your request: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object", code="invalid_json")
    return body


def create_app(state) -> Flask:
    app = Flask("pocketcupy")
    app.url_map.converters["model_id"] = _ModelIdConverter
    app.config["MAX_CONTENT_LENGTH"] = state.config.max_request_bytes
    app.extensions["pocketcupy"] = state
    metrics = state.metrics

    @app.before_request
    def _check_key():
        key = state.config.api_key
        if not key or request.path in PROBES:
            return None
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":       # Anthropic's clients send the key as x-api-key
            token = request.headers.get("x-api-key", "")
        if not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>' (or x-api-key)",
                           code="invalid_api_key")
        return None

    @app.after_request
    def _count(resp):
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        metrics.http_requests.labels(rule, str(resp.status_code)).inc()
        return resp

    def _error(e: ApiError) -> Response:
        anthropic = request.path.startswith("/v1/messages")
        return _json(e.anthropic_body() if anthropic else e.body(), e.status)

    @app.errorhandler(ApiError)
    def _api_error(e: ApiError):
        return _error(e)

    @app.errorhandler(HTTPException)
    def _http_error(e: HTTPException):
        status = e.code or 500
        if status == 413:   # (an upload's limit is --max-file-bytes)
            msg = f"request body exceeds the limit of {request.max_content_length} bytes"
        elif status == 404:
            msg = f"Unknown route {request.method} {request.path}"
        else:
            msg = e.description or e.name
        return _error(ApiError(status, msg))

    @app.errorhandler(ClientGone)
    def _gone(e: ClientGone):
        log.info("client went away: %s %s aborted", request.method, request.path)
        return Response(b"", status=GONE_STATUS)  # nobody reads it

    @app.errorhandler(Exception)
    def _internal(e: Exception):
        log.exception("request failed: %s %s", request.method, request.path)
        return _error(ApiError(500, f"internal server error: {type(e).__name__}"))

    def _ready():
        if state.status != "ready":
            what = {"loading": "the model is still loading", "draining": "the server is shutting down"}.get(
                state.status, "the model failed to load")
            raise ApiError(503, f"Service unavailable: {what}")

    def _request_body() -> dict:
        _ready()
        return _body(state.config.max_request_bytes, state.config.client_timeout_s)

    def _pooling(handler):
        return _json(handler(state, _request_body(), disconnect_probe(request.environ)))

    def _events(stream: SSEStream) -> Response:
        return Response(stream, mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def _generate(handler):
        result = handler(state, _request_body(), disconnect_probe(request.environ))
        return _events(result) if isinstance(result, SSEStream) else _json(result)

    @app.post("/v1/chat/completions")
    def chat_completions():
        return _generate(handle_chat)

    @app.post("/v1/completions")
    def completions():
        return _generate(handle_completion)

    @app.post("/v1/responses")
    def responses():
        return _generate(handle_responses)

    @app.post("/v1/responses/input_tokens")
    def input_tokens():
        return _json(handle_input_tokens(state, _request_body()))

    def _no_response(response_id: str) -> ApiError:
        why = "" if state.responses is not None else " (the server keeps none: start it with --responses-store N)"
        return ApiError(404, f"No response with id '{response_id}'{why}", "response_id", "not_found")

    def _stored(response_id: str) -> tuple[list, dict, int]:
        """The store's entry of a response (ResponseStore.get), or a 404."""
        _ready()
        found = state.responses.get(response_id) if state.responses is not None else None
        if found is None:
            raise _no_response(response_id)
        return found

    @app.get("/v1/responses/<path:response_id>")
    def stored_response(response_id):
        response = _stored(response_id)[1]
        if request.args.get("stream", "false") != "false":
            return _events(resumed(state, response_id, request.args))
        return _json(response)

    @app.post("/v1/responses/<path:response_id>/cancel")
    def cancel_response(response_id):
        return _json(cancelled(state, response_id, _stored(response_id)[1]))

    @app.get("/v1/responses/<path:response_id>/input_items")
    def stored_input_items(response_id):
        items, _, first = _stored(response_id)
        return _json(item_page(items[first:], request.args))

    @app.delete("/v1/responses/<path:response_id>")
    def delete_response(response_id):
        _ready()
        if state.responses is None or not state.responses.delete(response_id):
            raise _no_response(response_id)
        return _json({"id": response_id, "object": "response.deleted", "deleted": True})

    @app.post("/v1/files")
    def upload_file():
        request.max_content_length = state.config.max_file_bytes
        with _stall_timeout(state.config.client_timeout_s):
            return _json(files_api.upload(state.files, request.form, request.files))

    @app.get("/v1/files")
    def list_files():
        return _json(files_api.listing(state.files, request.args))

    @app.get("/v1/files/<file_id>")
    def file_object(file_id):
        return _json(files_api.found(state.files, file_id))

    @app.get("/v1/files/<file_id>/content")
    def file_content(file_id):
        return send_file(files_api.opened(state.files, file_id), mimetype="application/octet-stream")

    @app.delete("/v1/files/<file_id>")
    def delete_file(file_id):
        return _json(files_api.deleted(state.files, file_id))

    @app.post("/v1/batches")
    def create_batch():
        return _json(batches_api.create(state, app, _request_body()))

    @app.get("/v1/batches")
    def list_batches():
        return _json(batches_api.listing(state, request.args))

    @app.get("/v1/batches/<batch_id>")
    def batch_object(batch_id):
        return _json(state.batches.get(batch_id).view())

    @app.post("/v1/batches/<batch_id>/cancel")
    def cancel_batch(batch_id):
        return _json(batches_api.cancel(state, batch_id))

    @app.post("/v1/embeddings")
    def embeddings():
        return _pooling(handle_embeddings)

    @app.post("/score")
    @app.post("/v1/score")
    def score():
        return _pooling(handle_score)

    @app.post("/rerank")
    @app.post("/v1/rerank")
    @app.post("/v2/rerank")
    def rerank():
        return _pooling(handle_rerank)

    @app.post("/v1/messages")
    def messages():
        return _generate(handle_messages)

    @app.post("/v1/messages/count_tokens")
    def count_tokens():
        return _json(handle_count_tokens(state, _request_body()))

    @app.post("/tokenize")
    def tokenize():
        return _json(handle_tokenize(state, _request_body()))

    @app.post("/detokenize")
    def detokenize():
        return _json(handle_detokenize(state, _request_body()))

    def _model_card(name: str) -> dict:
        """vLLM's ModelCard: parent is a LoRA adapter's base model (none here); permission as vLLM's defaults."""
        permission = {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": state.started,
                      "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                      "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                      "organization": "*", "group": None, "is_blocking": False}
        return {"id": name, "object": "model", "created": state.started, "owned_by": "pocketcupy",
                "root": state.engine.model_path, "parent": None, "max_model_len": state.engine.max_model_len,
                "permission": [permission]}

    @app.get("/v1/models")
    def models():
        _ready()
        return _json({"object": "list", "data": [_model_card(n) for n in state.config.served_model_names]})

    @app.get("/v1/models/<model_id:model_id>")
    def model(model_id):
        _ready()
        if model_id not in state.config.served_model_names:
            raise ApiError(404, f"The model '{model_id}' does not exist", "model", "model_not_found")
        return _json(_model_card(model_id))

    @app.get("/version")
    def version():
        return _json({"version": __version__})

    @app.get("/alive")
    def alive():
        return _json({"status": "alive"})

    @app.get("/ready")
    def ready():
        return _json({"status": state.status}, 200 if state.ready else 503)

    @app.get("/health")
    def health():
        ok = state.engine is not None and state.status in ("ready", "draining")
        return _json({"status": state.status}, 200 if ok else 503)

    @app.get("/metrics")
    def metrics_route():
        data, ctype = metrics.render()
        return Response(data, mimetype=None, content_type=ctype)

    return app
