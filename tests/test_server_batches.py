"""The Files and Batches APIs (/v1/files, /v1/batches) with the real openai client against a real server
(with an API key, which the batch's own requests in the server need too): a batch's lines answered as the
same requests sent directly, successes and failures split into the output and error files, files listed,
paged and deleted, a cancel aborting the lines in flight, bad requests refused naming the field, and
SIGTERM ending a running batch instead of waiting for it; serve.py refusing bad --files-dir / --max-file-bytes."""
import json
import os
import signal
import time

import openai
import pytest

from tests.test_server_harness import MODEL, ServerProcess

KEY = "sk-batches"
QUESTIONS = ["What is the capital of France?", "Name a colour."]


@pytest.fixture(scope="module")
def served(smollm2_gguf, tmp_path_factory):
    files_dir = str(tmp_path_factory.mktemp("files"))
    s = ServerProcess(smollm2_gguf, "--max-file-bytes", "8192", "--files-dir", files_dir,
                      env={"POCKETCUPY_API_KEY": KEY})
    try:
        s.wait_ready()
        yield s, files_dir
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _line(custom_id, body, url="/v1/chat/completions"):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": MODEL, **body}})


def _chat(question, **extra):
    return {"messages": [{"role": "user", "content": question}], "max_tokens": 4, "temperature": 0, **extra}


def _upload(client, lines, purpose="batch"):
    return client.files.create(file=("requests.jsonl", ("\n".join(lines) + "\n").encode()), purpose=purpose)


def _wait(client, batch_id, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
            return batch
        time.sleep(0.05)


def _results(client, file_id):
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def test_batch_splits_output_and_errors(client):
    lines = [_line(f"q{i}", _chat(q)) for i, q in enumerate(QUESTIONS)] + [
        _line("bad-field", _chat("Hi", max_tokens=-1)),
        _line("other-url", {"prompt": "Hi", "max_tokens": 2}, url="/v1/completions")]
    src = _upload(client, lines)
    assert src.object == "file" and src.purpose == "batch" and src.status == "processed" and src.id.startswith("file-")
    batch = client.batches.create(input_file_id=src.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"job": "test"})
    assert batch.status == "validating" and batch.metadata == {"job": "test"}
    assert batch.endpoint == "/v1/chat/completions" and batch.id.startswith("batch_")
    done = _wait(client, batch.id)
    assert done.status == "completed" and done.request_counts.model_dump() == {"total": 4, "completed": 2, "failed": 2}
    assert done.in_progress_at and done.finalizing_at and done.completed_at and done.errors is None
    out = _results(client, done.output_file_id)
    assert [o["custom_id"] for o in out] == ["q0", "q1"]
    for o, q in zip(out, QUESTIONS):   # answered together in the batch, each as when sent alone
        direct = client.chat.completions.create(model=MODEL, **_chat(q))
        assert o["response"]["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
    errors = {e["custom_id"]: e for e in _results(client, done.error_file_id)}
    assert errors["bad-field"]["response"]["status_code"] == 400
    assert errors["bad-field"]["response"]["body"]["error"]["param"] == "max_tokens"
    assert errors["other-url"]["response"] is None and "'url' must be /v1/chat/completions" in \
        errors["other-url"]["error"]["message"]
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    with pytest.raises(openai.BadRequestError) as e:   # over: nothing to cancel
        client.batches.cancel(done.id)
    assert e.value.body["param"] == "batch_id"
    assert done.id in [b.id for b in client.batches.list(limit=5)]


def test_files_list_page_and_delete(client, served):
    ids = [_upload(client, ["{}"], purpose="user_data").id for _ in range(3)]
    page = client.files.list(purpose="user_data", limit=2)
    assert [f.id for f in page.data] == ids[:0:-1] and page.has_more
    assert page.get_next_page().data[0].id == ids[0]   # (the client's paging: after the page's last id)
    assert [f.id for f in client.files.list(purpose="user_data", order="asc", after=ids[0])] == ids[1:]
    assert client.files.content(ids[0]).content == b"{}\n"
    assert client.files.delete(ids[0]).deleted
    assert not os.path.exists(os.path.join(served[1], ids[0]))
    for call in (client.files.retrieve, client.files.content, client.files.delete):
        with pytest.raises(openai.NotFoundError):
            call(ids[0])
    assert os.path.exists(os.path.join(served[1], ids[1])) and ids[0] not in [f.id for f in client.files.list()]


def test_cancel_aborts_the_lines_in_flight(client):
    long = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True, "temperature": 0}
    src = _upload(client, [_line(f"long-{i}", long, url="/v1/completions") for i in range(6)])
    batch = client.batches.create(input_file_id=src.id, endpoint="/v1/completions", completion_window="24h")
    while client.batches.retrieve(batch.id).status == "validating":
        time.sleep(0.02)
    t0 = time.monotonic()
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = _wait(client, batch.id)
    assert done.status == "cancelled" and done.cancelling_at and done.cancelled_at and time.monotonic() - t0 < 5
    assert done.request_counts.model_dump() == {"total": 6, "completed": 0, "failed": 0}
    errors = _results(client, done.error_file_id)
    assert [e["custom_id"] for e in errors] == [f"long-{i}" for i in range(6)] and done.output_file_id is None
    assert all(e["error"]["code"] == "batch_cancelled" for e in errors)
    assert client.batches.cancel(batch.id).status == "cancelled"   # (again: as it is)


def test_bad_requests(client):
    def refused(call, param, kind=openai.BadRequestError):
        with pytest.raises(kind) as e:
            call()
        assert e.value.body["param"] == param, e.value.body

    src = _upload(client, [_line("x", _chat("Hi"))])
    plain = _upload(client, ["{}"], purpose="user_data")
    refused(lambda: client.files.create(file=("a.jsonl", b"{}"), purpose="batch_output"), "purpose")
    refused(lambda: client.post("/files", body={"purpose": "batch"}, cast_to=object,
                                options={"headers": {"Content-Type": "multipart/form-data"}},
                                files=[("purpose", (None, b"batch"))]), "file")
    with pytest.raises(openai.APIStatusError) as e:   # (a body 64 KiB over the limit may lose its 413 to a reset)
        client.files.create(file=("big.jsonl", b"x" * 10000), purpose="batch")
    assert e.value.status_code == 413 and "8192" in e.value.message
    create = client.batches.create
    refused(lambda: create(input_file_id=src.id, endpoint="/v1/moderations", completion_window="24h"), "endpoint")
    refused(lambda: create(input_file_id=src.id, endpoint="/v1/completions", completion_window="1h"),
            "completion_window")
    refused(lambda: create(input_file_id=src.id, endpoint="/v1/completions", completion_window="24h",
                           metadata={"k": 1}), "metadata")
    refused(lambda: create(input_file_id=plain.id, endpoint="/v1/completions", completion_window="24h"),
            "input_file_id")
    refused(lambda: create(input_file_id="file-nope", endpoint="/v1/completions", completion_window="24h"),
            "input_file_id", openai.NotFoundError)
    refused(lambda: client.batches.retrieve("batch_nope"), "batch_id", openai.NotFoundError)
    refused(lambda: client.files.list(limit=0), "limit")


def test_sigterm_cancels_a_running_batch(client, served):
    server, files_dir = served
    long = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True, "temperature": 0}
    src = _upload(client, [_line("long", long, url="/v1/completions")])
    batch = client.batches.create(input_file_id=src.id, endpoint="/v1/completions", completion_window="24h")
    time.sleep(0.3)
    t0 = time.monotonic()
    assert server.stop(signal.SIGTERM, timeout=20) == 0 and time.monotonic() - t0 < 10
    kept = []   # the partial output, in --files-dir
    for name in os.listdir(files_dir):
        if name.endswith(".json"):
            with open(os.path.join(files_dir, name)) as f:
                kept.append(json.load(f)["filename"])
    assert f"{batch.id}_error.jsonl" in kept


@pytest.mark.parametrize("flag, value", [("--files-dir", "/proc/no/such"), ("--max-file-bytes", "0")])
def test_serve_refuses_bad_files_flags(smollm2_gguf, capsys, flag, value):
    from tests.helpers import load_script

    assert load_script("serve").main(["--model", smollm2_gguf, "--device", "cpu", flag, value]) == 2
    assert capsys.readouterr().err.startswith(f"error: {flag[2:].replace('-', '_')}: ")
