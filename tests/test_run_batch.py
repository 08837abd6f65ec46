"""`python -m pocketcupy run-batch` (vLLM's run_batch): an OpenAI Batch API file answered by the
server's routes in process, with the real SmolLM2 on the CPU. Results come in the input's order and
equal what the engine gives each request alone; refused requests carry their status and error body;
lines that are no request get an error of their own."""
import json

import numpy as np
import pytest

from pocketcupy import SamplingParams
from pocketcupy.cli import main

MODEL = "smol"
QUESTIONS = ["What is the capital of France?", "Name a colour.", "What is 2 + 2?", "Say hello."]


@pytest.fixture(scope="module")
def local(smollm2_engine):
    return smollm2_engine


def _line(custom_id, url, body, method="POST"):
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": {"model": MODEL, **body}})


def test_run_batch_file(tmp_path, smollm2_gguf, local, capsys):
    chats = [_line(f"chat-{i}", "/v1/chat/completions",
                   {"messages": [{"role": "user", "content": q}], "max_tokens": 8, "temperature": 0})
             for i, q in enumerate(QUESTIONS)]
    lines = chats + [
        _line("cmpl", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}),
        _line("embd", "/v1/embeddings", {"input": ["a cat", "a dog"]}),
        _line("rank", "/v1/rerank", {"query": "capital of France", "documents": ["Paris is in France.", "Cats"]}),
        "",
        _line("wrong-model", "/v1/chat/completions", {"model": "other", "messages": [{"role": "user",
                                                                                        "content": "x"}]}),
        _line("streamed", "/v1/completions", {"prompt": "hi", "stream": True}),
        _line("bad-field", "/v1/completions", {"prompt": "hi", "max_tokens": -1}),
        "{not json",
        _line("get", "/v1/completions", {"prompt": "hi"}, method="GET"),
        _line("moderation", "/v1/moderations", {"input": "hi"}),
    ]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    assert main(["run-batch", "-i", str(src), "-o", str(dst), "--model", smollm2_gguf, "--device", "cpu",
                 "--served-model-name", MODEL, "--concurrency", "8"]) == 0
    counts = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert counts["requests"] == 13 and counts["succeeded"] == 7 and counts["failed"] == 6
    out = [json.loads(x) for x in dst.read_text().splitlines()]
    assert [o["custom_id"] for o in out] == ([f"chat-{i}" for i in range(4)] +
                                             ["cmpl", "embd", "rank", "wrong-model", "streamed", "bad-field", None,
                                              "get", "moderation"])
    assert len({o["id"] for o in out}) == 13 and all(o["id"].startswith("batch_req-") for o in out)

    greedy = SamplingParams(temperature=0, max_tokens=8)
    for o, q in zip(out[:4], QUESTIONS):   # answered together, each as alone
        r = o["response"]
        assert o["error"] is None and r["status_code"] == 200 and r["request_id"] == r["body"]["id"]
        want = local.chat([{"role": "user", "content": q}], greedy)[0].outputs[0].text
        assert r["body"]["choices"][0]["message"]["content"] == want and r["body"]["model"] == MODEL
    cmpl = out[4]["response"]["body"]
    want = local.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=6))[0].outputs[0].text
    assert cmpl["choices"][0]["text"] == want
    vecs = [d["embedding"] for d in out[5]["response"]["body"]["data"]]
    np.testing.assert_allclose(vecs, [e.outputs.embedding for e in local.embed(["a cat", "a dog"])], atol=1e-5)
    assert {r["index"] for r in out[6]["response"]["body"]["results"]} == {0, 1}

    refused = {o["custom_id"]: o["response"] for o in out[7:10]}
    assert refused["wrong-model"]["status_code"] == 404 and refused["wrong-model"]["body"]["error"]["param"] == "model"
    for cid, param in (("streamed", "stream"), ("bad-field", "max_tokens")):
        assert refused[cid]["status_code"] == 400 and refused[cid]["body"]["error"]["param"] == param
    assert all(o["error"] is None for o in out[:10])
    for o, words in zip(out[10:], ("line 12", "'method' must be 'POST'", "'url' must be one of")):
        assert o["response"] is None and o["error"]["code"] == "invalid_request" and words in o["error"]["message"]


def test_run_batch_bad_arguments(tmp_path, capsys):
    assert main(["run-batch", "-i", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    src = tmp_path / "in.jsonl"
    src.write_text("")
    assert main(["run-batch", "-i", str(src), "-o", str(tmp_path / "o.jsonl"), "--concurrency", "0"]) == 2
    assert "concurrency" in capsys.readouterr().err
    assert main(["run-batch", "-i", str(src), "-o", str(tmp_path / "o.jsonl"), "--model",
                 str(tmp_path / "nope.gguf")]) == 3
