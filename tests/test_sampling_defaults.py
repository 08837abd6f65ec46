"""A model's recommended sampling settings (vLLM's --generation-config auto): read from a GGUF's
general.sampling.* keys or a folder's generation_config.json; used where a request (library or
server) leaves a setting out; generation_config="vllm" ignores them. With the real SmolLM2 (whose
GGUF recommends nothing, so the tests give its engine settings)."""
import json
import logging

import pytest

from pocketcupy import EngineArgs, SamplingParams
from pocketcupy.sampling_defaults import model_sampling_defaults
from pocketcupy.server.app import create_app
from pocketcupy.server.state import ServerConfig, ServerState

from tests.test_server_harness import MODEL

ASK = [{"role": "user", "content": "Tell me about the sea."}]


def test_read_from_gguf_keys_and_generation_config(tmp_path, caplog):
    meta = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20, "general.sampling.top_p": 0.95,
            "general.sampling.penalty_repeat": 1.05, "general.sampling.mirostat": 0, "general.name": "x"}
    assert model_sampling_defaults(meta, None) == {"temperature": 0.6, "top_k": 20, "top_p": 0.95,
                                                   "repetition_penalty": 1.05}
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0, "max_new_tokens": 99}))
    assert model_sampling_defaults(None, str(tmp_path)) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20,
                                                            "min_p": 0.0}
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 0.0, "temperature": 0.3}))
    with caplog.at_level(logging.WARNING, logger="pocketcupy"):
        assert model_sampling_defaults(None, str(tmp_path)) == {"temperature": 0.3}
    assert "top_p" in caplog.text
    assert model_sampling_defaults(None, str(tmp_path / "none")) == {}
    with pytest.raises(ValueError, match="generation_config"):
        EngineArgs(generation_config="model")


@pytest.fixture(scope="module")
def engine(smollm2_engine):
    e = smollm2_engine
    assert e.default_sampling == {}
    return e


def test_library_requests_without_params_take_them(engine, monkeypatch):
    greedy = engine.generate("The sea is", SamplingParams(temperature=0, max_tokens=10))[0].outputs[0].token_ids
    monkeypatch.setattr(engine, "default_sampling", {"temperature": 0.0, "top_k": 3, "max_tokens": 10})
    assert engine.get_default_sampling_params() == SamplingParams(temperature=0.0, top_k=3, max_tokens=10)
    assert [o.outputs[0].token_ids for o in engine.generate(["The sea is"] * 2)] == [greedy] * 2
    sampled = engine.generate(["The sea is"] * 2, SamplingParams(temperature=1.0, seed=1, max_tokens=10))
    assert sampled[0].outputs[0].token_ids != greedy   # given params are taken as they are


def test_server_fields_left_out_take_them(smollm2_gguf):
    state = ServerState(ServerConfig(engine_args=EngineArgs(model=smollm2_gguf, device="cpu", progress=False),
                                     served_model_names=[MODEL]))
    state.load()
    try:
        app = create_app(state).test_client()

        def ask(**kw):
            r = app.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 12, **kw})
            assert r.status_code == 200, r.get_json()
            return r.get_json()["choices"][0]["message"]["content"]

        greedy = ask(temperature=0)
        state.engine.default_sampling = {"temperature": 0.0}
        assert ask() == ask() == greedy
        assert ask(temperature=1.0, seed=3) == ask(temperature=1.0, seed=3) != greedy
        state.engine.default_sampling = {}
        assert len({ask(seed=s) for s in range(3)}) > 1   # OpenAI's default temperature, 1
    finally:
        state.shutdown(30)
