"""OpenAI-compatible HTTP server (flask under gunicorn). Start it with `python scripts/serve.py`.

app.py         routes, API key, body limit, error bodies
chat.py        /v1/chat/completions        completions.py  /v1/completions
protocol.py    field validation, OpenAI error bodies
tool_prompt.py tools/tool_choice/messages -> chat template   tools.py  tool-call parsing
               (tools_mistral.py: Mistral's [TOOL_CALLS] forms, ids and forced prefill)
generation.py  engine requests of one API call (disconnects, metrics)   sse.py  event streams
metrics.py     Prometheus              state.py  engine loading, readiness
gunicorn_app.py  the in-process gunicorn application   gunicorn_worker.py  its worker (connections)
gunicorn_errors.py  requests gunicorn refuses (limits, unparsable) answered with OpenAI's JSON error body
embeddings.py  /v1/embeddings          scoring.py  /v1/score, /v1/rerank (over embeddings)
batch.py       OpenAI Batch API files answered by these routes in process (python -m pocketcupy run-batch)
"""
