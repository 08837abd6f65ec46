"""Prometheus metrics of one server process (its own registry, rendered at GET /metrics).

HTTP-side series are updated as requests are served; engine-side ones (queue lengths, KV
blocks, prefix cache, preemptions, speculative decoding, structured output) are read from
Engine.stats() at scrape time (while a step runs, as that step began: a scrape never waits out a
step).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

P = "pocketcupy_"
_LATENCY = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_PER_TOKEN = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_E2E = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0, 300.0, 600.0)
_TOKENS = tuple(m * 10 ** e for e in range(7) for m in (1, 2, 5))   # 1, 2, 5, 10, ... 5,000,000 (vLLM's 1-2-5)
_N = (1, 2, 5, 10, 20)


class _EngineCollector:
    def __init__(self, state):
        self.state = state

    def collect(self):
        engine = self.state.engine
        yield GaugeMetricFamily(P + "model_ready", "1 once the model is loaded and requests are accepted",
                                value=1.0 if self.state.ready else 0.0)
        if engine is None:
            return
        s = engine.stats(wait=False)   # (a step in progress: as it began)
        gauges = [("num_requests_running", "requests in the running batch", s.get("num_running", 0)),
                  ("num_requests_waiting", "requests waiting to be scheduled", s.get("num_waiting", 0)),
                  ("kv_blocks_used", "KV cache blocks in use", s.get("kv_blocks_used", 0)),
                  ("kv_blocks_total", "KV cache blocks in the pool", s.get("kv_blocks_total", 0)),
                  ("recurrent_state_bytes", "bytes of the recurrent state slots of hybrid models (Qwen3-Next), "
                   "inside kv_cache_memory", s.get("recurrent_state_bytes", 0))]
        total = s.get("kv_blocks_total", 0)
        gauges.append(("kv_cache_usage_ratio", "fraction of KV cache blocks in use",
                       s.get("kv_blocks_used", 0) / total if total else 0.0))
        queries, hits = s.get("prefix_cache_queries", 0), s.get("prefix_cache_hits", 0)
        gauges.append(("prefix_cache_hit_rate", "prefix cache hits / queries (tokens) since start",
                       hits / queries if queries else 0.0))
        for name, doc, v in gauges:
            yield GaugeMetricFamily(P + name, doc, value=float(v))
        info = GaugeMetricFamily(P + "cache_config_info", "KV cache configuration (labels; value 1), as vLLM's "
                                 "cache_config_info", labels=["block_size", "cache_dtype", "num_blocks"])
        info.add_metric([str(engine.args.block_size), engine.args.kv_cache_dtype, str(total)], 1.0)
        yield info
        for name, doc, v in [("num_preemptions", "requests preempted to free KV blocks", s.get("num_preemptions", 0)),
                             ("prefix_cache_queries", "tokens looked up in the prefix cache", queries),
                             ("prefix_cache_hits", "tokens found in the prefix cache", hits),
                             ("computed_tokens", "tokens the model computed (prefill + decode)",
                              s.get("num_computed_tokens_total", 0)),
                             ("spec_decode_num_drafts", "speculative decoding: steps that verified a "
                              "request's draft tokens", s.get("spec_num_drafts", 0)),
                             ("spec_decode_num_draft_tokens", "speculative decoding: draft tokens verified",
                              s.get("spec_num_draft_tokens", 0)),
                             ("spec_decode_num_accepted_tokens", "speculative decoding: draft tokens the "
                              "sampler kept", s.get("spec_num_accepted_tokens", 0))]:
            yield CounterMetricFamily(P + name, doc, value=float(v))
        yield from _structured(s.get("structured"))


def _structured(st: dict | None):
    if not st:
        return
    yield CounterMetricFamily(P + "structured_requests", "requests with a structured-output constraint",
                              value=float(st["requests"]))
    yield HistogramMetricFamily(P + "structured_mask_seconds", "time an engine step spent computing the token "
                                "masks of its constrained sequences", sum_value=st["mask_sum"],
                                buckets=[(repr(le), c) for le, c in st["mask_buckets"]] + [("+Inf", st["mask_count"])])


class Metrics:
    def __init__(self, state):
        r = self.registry = CollectorRegistry()
        self.http_requests = Counter(P + "http_requests", "HTTP requests by route and status code",
                                     ["route", "status"], registry=r)
        self.requests_in_flight = Gauge(P + "requests_in_flight", "generation requests being served", registry=r)
        self.finished = Counter(P + "request_finished", "finished engine requests (each of a request's n "
                                "sequences) by finish reason", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "prompt tokens submitted", registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "tokens generated", registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "arrival to first generated token",
                              buckets=_LATENCY, registry=r)
        self.tpot = Histogram(P + "time_per_output_token_seconds", "mean time between generated tokens "
                              "of a request", buckets=_PER_TOKEN, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "arrival to last token",
                             buckets=_E2E, registry=r)
        self.queue_time = Histogram(P + "request_queue_time_seconds", "arrival in the engine to first "
                                    "scheduling (time spent waiting for a batch slot or KV blocks)",
                                    buckets=_LATENCY, registry=r)
        # vLLM's per-request histograms: an engine request is a prompt (its phases) or one of its n sequences
        # (its token counts), observed when it finishes
        self.prefill_time = Histogram(P + "request_prefill_time_seconds", "first scheduling to first generated "
                                      "token", buckets=_E2E, registry=r)
        self.decode_time = Histogram(P + "request_decode_time_seconds", "first generated token to last",
                                     buckets=_E2E, registry=r)
        self.inference_time = Histogram(P + "request_inference_time_seconds", "first scheduling to last token",
                                        buckets=_E2E, registry=r)
        self.itl = Histogram(P + "inter_token_latency_seconds", "time between two outputs of a request that "
                             "bring new tokens", buckets=_PER_TOKEN, registry=r)
        self.request_prompt_tokens = Histogram(P + "request_prompt_tokens", "prompt tokens of a finished "
                                               "sequence", buckets=_TOKENS, registry=r)
        self.request_generation_tokens = Histogram(P + "request_generation_tokens", "tokens a finished "
                                                   "sequence generated", buckets=_TOKENS, registry=r)
        self.params_n = Histogram(P + "request_params_n", "the n of a finished request", buckets=_N, registry=r)
        self.params_max_tokens = Histogram(P + "request_params_max_tokens", "the max_tokens of a finished "
                                           "request (when set)", buckets=_TOKENS, registry=r)
        r.register(_EngineCollector(state))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
