"""request_finished_total through the real server's /metrics: each of a request's n sequences is an
engine request of its own (as vLLM's n child requests; each is in num_requests_running), counted
once, for the reason it ended with, whether the request finishes or its client goes away."""
import http.client
import json
import time

from tests.test_server_api import _wait_idle
from tests.test_server_harness import MODEL, metric, metrics, request, server, sse_events  # noqa: F401

FINISHED = "pocketcupy_request_finished_total"


def finished(m) -> dict:
    return {dict(labels)["finish_reason"]: v for (name, labels), v in m.items() if name == FINISHED}


def moved(m0, m1) -> dict:
    a, b = finished(m0), finished(m1)
    return {k: b[k] - a.get(k, 0) for k in b if b[k] != a.get(k, 0)}


def test_n_choices_count_once_each(server):
    m0 = metrics(server)
    status, body, _ = request(server, "POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "n": 3, "max_tokens": 2,
        "ignore_eos": True, "temperature": 1.0, "seed": 1})
    assert status == 200 and [c["finish_reason"] for c in body["choices"]] == ["length"] * 3
    assert moved(m0, _wait_idle(server)) == {"length": 3}


def _first_choice_ended(server, seed: int):
    """Streams an n=2 request whose choices end at once ("[0-4]") or after 6000 more characters;
    -> (the connection and response, read up to the first chunk that ends a choice or 24 chunks, and
    the choices ended by then)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Pick a random digit."}], "n": 2,
            "temperature": 2.0, "seed": seed, "max_tokens": 7000, "guided_regex": "[0-4]|[5-9]B{6000}",
            "stream": True}
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    ended, chunks = set(), 0
    while not ended and chunks < 24 and (line := r.readline()):
        if line.startswith(b"data: {"):
            chunks += 1
            for ch in json.loads(line[6:])["choices"]:
                if ch["finish_reason"] is not None:
                    ended.add(ch["index"])
    return c, r, ended


def test_client_gone_counts_only_the_choices_still_running(server):
    """A choice that ended before the client went away counts for its own reason, the other one as
    aborted (both counted as aborted, the ended one's "stop" lost, before)."""
    for seed in range(12):   # a seed whose choices take different branches of the regex
        m0 = _wait_idle(server)
        c, r, ended = _first_choice_ended(server, seed)
        time.sleep(0.3)
        if len(ended) == 1 and metric(metrics(server), "pocketcupy_num_requests_running") == 1:
            break
        r.close()   # both ended at once, or neither soon: the next seed
        c.close()
    else:
        raise AssertionError("no seed made one choice end first")
    r.close()
    c.close()   # the client goes away while the other choice runs
    assert moved(m0, _wait_idle(server)) == {"stop": 1, "abort": 1}


def test_request_the_engine_fails_counts_as_error(server):
    """A request the engine fails once admitted (here bad_words forbid the one token allowed_token_ids
    allows: the engine fails it, a 400 naming bad_words, where the sampler drew a token outside
    allowed_token_ids) is a finished request of reason "error", each of its n sequences once (it was not
    counted at all); a 400 refused before admission is none."""
    hello = request(server, "POST", "/tokenize", {"prompt": " hello", "add_special_tokens": False})[1]["tokens"]
    body = {"model": MODEL, "prompt": "Say", "max_tokens": 4, "allowed_token_ids": hello, "bad_words": ["hello"]}
    m0 = _wait_idle(server)
    status, r, _ = request(server, "POST", "/v1/completions", body)
    assert status == 400 and r["error"]["param"] == "bad_words", r
    status, events = sse_events(server, "/v1/completions", dict(body, stream=True, n=2))
    assert status == 200 and "bad_words" in events[-2]["error"]["message"] and events[-1] == "DONE", events
    assert request(server, "POST", "/v1/completions", dict(body, max_tokens=-1))[0] == 400   # not admitted
    assert moved(m0, _wait_idle(server)) == {"error": 3}
