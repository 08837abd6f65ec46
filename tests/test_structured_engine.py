"""Structured output end to end on the CPU with the real SmolLM2-135M-Instruct: JSON schemas (every
output parses and validates with `jsonschema`), regexes, choice, Lark and GBNF grammars; constrained
and free requests in one batch; n > 1, logprobs, stop strings, streaming; the sequence ends when
the structure is complete; a constraint that cannot be met ends its sequence alone."""
import ast
import json
import re
from types import SimpleNamespace

import jsonschema
import pytest

from pocketcupy import Engine, SamplingParams
from pocketcupy.structured import StructuredOutputsParams
from tests.test_structured_params import ARITH_LARK

ARITH_GBNF = """
root ::= expr
expr ::= term (("+" | "-") term){0,3}
term ::= factor (("*" | "/") factor){0,2}
factor ::= [0-9]{1,3} | "(" expr ")"
"""


def S(n=24):
    return {"type": "string", "maxLength": n}


def INT(lo, hi):
    return {"type": "integer", "minimum": lo, "maximum": hi}


def obj(props, required=None):
    return {"type": "object", "properties": props, "additionalProperties": False,
            "required": list(props) if required is None else required}


SCHEMAS = [  # (what the prompt asks for, schema)
    ("a person", obj({"name": S(), "age": INT(0, 120)})),
    ("a book", obj({"title": S(40), "author": S(), "year": INT(1400, 2025)})),
    ("a city", obj({"city": S(), "country": S(), "population": INT(0, 40_000_000)})),
    ("a product with a price", obj({"product": S(), "price": {"type": "number", "minimum": 0, "maximum": 1000}})),
    ("a temperature reading", obj({"celsius": {"type": "number", "minimum": -50, "maximum": 60},
                                   "unit": {"enum": ["C", "F"]}})),
    ("a traffic light state", obj({"color": {"type": "string", "enum": ["red", "yellow", "green"]}})),
    ("a to-do list", obj({"items": {"type": "array", "items": S(20), "minItems": 1, "maxItems": 3}})),
    ("three prime numbers", obj({"primes": {"type": "array", "items": INT(2, 100), "minItems": 3, "maxItems": 3}})),
    ("a user with an address", obj({"user": S(), "address": obj({
        "street": S(), "city": S(), "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})})),
    ("a point", obj({"x": {"type": "number", "minimum": -10, "maximum": 10},
                     "y": {"type": "number", "minimum": -10, "maximum": 10}})),
    ("a boolean flag", obj({"enabled": {"type": "boolean"}, "reason": S()})),
    ("a contact", obj({"name": S(), "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
                       "phone": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}}, required=["name", "email"])),
    ("a date", obj({"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}, "event": S()})),
    ("a pet", obj({"species": {"enum": ["cat", "dog", "bird"]}, "name": S(), "age": INT(0, 30)}, required=["species"])),
    ("an id that is a number or a string", obj({"id": {"anyOf": [INT(0, 9999), S(12)]}})),
    ("a nullable nickname", obj({"name": S(), "nickname": {"anyOf": [S(), {"type": "null"}]}})),
    ("a matrix of small numbers", obj({"rows": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": INT(0, 9)}}})),
    ("a team of people", obj({"team": S(), "members": {"type": "array", "minItems": 1, "maxItems": 2,
                                                       "items": obj({"name": S(16), "role": {"enum": ["dev", "pm"]}})}})),
    ("a rating", obj({"stars": INT(1, 5), "comment": S(16)}, required=["stars"])),
    ("a color in hex", obj({"name": S(), "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}})),
    ("a version", obj({"major": INT(0, 99), "minor": INT(0, 99), "tag": {"const": "stable"}})),
    ("a shape", {"anyOf": [obj({"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0, "maximum": 99}}),
                           obj({"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0, "maximum": 99}})]}),
    ("a list of tags", {"type": "array", "items": {"enum": ["news", "sport", "tech", "art"]}, "minItems": 1, "maxItems": 3}),
    ("an order", obj({"order_id": INT(1, 99999), "paid": {"type": "boolean"}, "lines": {
        "type": "array", "minItems": 1, "maxItems": 2,
        "items": obj({"sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"}, "qty": INT(1, 9)})}})),
]

REGEXES = {
    "iso_date": (r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])", "On what date did the first moon landing happen?"),
    "email": (r"[a-z0-9._]{1,20}@[a-z0-9]{1,12}\.(com|org|net)", "What is the support e-mail address of a shop?"),
    "ipv4": (r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)",
             "What is the IP address of a home router?"),
}


def user(text):
    return [{"role": "user", "content": text}]


def greedy(**kw):
    return SamplingParams(temperature=0, **{"max_tokens": 160, **kw})


@pytest.fixture(scope="module")
def engine(smollm2_gguf):
    return Engine(smollm2_gguf, device="cpu", progress=False, max_num_seqs=32)


def check_all_schemas(engine) -> None:
    """Every schema in SCHEMAS, in one batch: each output completes and validates."""
    outs = engine.chat([user(f"Describe {what} as JSON.") for what, _ in SCHEMAS],
                       [greedy(structured_outputs={"json": s}) for _, s in SCHEMAS])
    for (what, schema), out in zip(SCHEMAS, outs):
        o = out.outputs[0]
        assert o.finish_reason == "stop", (what, o.text)
        jsonschema.validate(json.loads(o.text), schema)


def test_json_schemas_all_validate(engine):
    assert len(SCHEMAS) >= 20
    check_all_schemas(engine)


def test_json_object_and_string_schema(engine):
    schema = obj({"answer": S(30)})
    outs = engine.chat([user("Give the capital of France as JSON.")] * 2,
                       [greedy(structured_outputs={"json": True}, max_tokens=64),
                        greedy(structured_outputs={"json": json.dumps(schema)})])
    assert isinstance(json.loads(outs[0].outputs[0].text), dict)
    jsonschema.validate(json.loads(outs[1].outputs[0].text), schema)


def test_regexes(engine):
    names = list(REGEXES)
    outs = engine.chat([user(REGEXES[n][1]) for n in names],
                       [greedy(structured_outputs={"regex": REGEXES[n][0]}, max_tokens=40) for n in names])
    for n, out in zip(names, outs):
        o = out.outputs[0]
        assert o.finish_reason == "stop" and re.fullmatch(REGEXES[n][0], o.text, re.ASCII), (n, o.text)


def test_choice(engine):
    choices = ["positive", "negative", "neutral"]
    outs = engine.chat([user(f"Sentiment of: '{t}'") for t in ("I love it!", "This is awful.", "It is a chair.")],
                       greedy(structured_outputs={"choice": choices}))
    assert all(o.outputs[0].text in choices and o.outputs[0].finish_reason == "stop" for o in outs)


def _parses_as_arithmetic(text: str) -> bool:
    tree = ast.parse(text, mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Constant)
    return all(isinstance(n, allowed) for n in ast.walk(tree))


@pytest.mark.parametrize("grammar", [ARITH_LARK, ARITH_GBNF], ids=["lark", "gbnf"])
def test_arithmetic_grammar(engine, grammar):
    prompts = ["Write an arithmetic expression that equals 10.", "2 plus 3 times 4 as a formula:",
               "An expression with brackets:"]
    outs = engine.chat([user(p) for p in prompts], greedy(structured_outputs={"grammar": grammar}, max_tokens=48))
    for out in outs:
        o = out.outputs[0]
        assert o.finish_reason in ("stop", "length") and _parses_as_arithmetic(o.text), o.text
        assert re.fullmatch(r"[0-9+\-*/()]+", o.text), o.text


def test_mixed_batch_free_outputs_equal_alone(engine):
    free = ["The history of Rome", "My favourite food is", "Water boils at"]
    fp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    alone = [engine.generate(p, fp)[0].outputs[0].token_ids for p in free]
    cons = [("A person as JSON:", {"json": SCHEMAS[0][1]}), ("Date:", {"regex": REGEXES["iso_date"][0]}),
            ("Yes or no?", {"choice": ["yes", "no"]})]
    prompts = [x for pair in zip(free, [c[0] for c in cons]) for x in pair]
    params = [x for pair in zip([fp] * 3, [greedy(structured_outputs=c[1], max_tokens=40) for c in cons]) for x in pair]
    outs = engine.generate(prompts, params)
    assert [outs[i].outputs[0].token_ids for i in (0, 2, 4)] == alone
    jsonschema.validate(json.loads(outs[1].outputs[0].text), SCHEMAS[0][1])
    assert re.fullmatch(REGEXES["iso_date"][0], outs[3].outputs[0].text) and outs[5].outputs[0].text in ("yes", "no")


def test_n_samples_each_follow_the_schema(engine):
    schema = SCHEMAS[13][1]  # a pet
    out = engine.chat(user("Describe a pet as JSON."), SamplingParams(
        n=4, temperature=1.0, seed=7, max_tokens=120, structured_outputs={"json": schema}))[0]
    texts = [o.text for o in out.outputs]
    for o in out.outputs:
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), schema)
    assert len(set(texts)) > 1  # separate matchers: each sample takes its own path


def test_logprobs_are_over_the_allowed_tokens(engine):
    choices = ["yes", "no"]
    tok = engine.tokenizer
    out = engine.chat(user("Is the sky blue?"), greedy(structured_outputs={"choice": choices}, logprobs=5))[0]
    o = out.outputs[0]
    assert o.text in choices and len(o.logprobs) == len(o.token_ids)
    first = o.logprobs[0]
    allowed = {t: lp for t, lp in first.items() if lp.logprob > float("-inf")}
    assert o.token_ids[0] in allowed and first[o.token_ids[0]].rank == 1
    assert all(any(c.startswith(tok.decode([t])) for c in choices) for t in allowed)
    assert sum(2.718281828 ** lp.logprob for lp in allowed.values()) <= 1.0 + 1e-5


def test_stop_string_inside_a_structure(engine):
    p = greedy(structured_outputs={"json": SCHEMAS[0][1]}, stop=['"age"'])
    o = engine.chat(user("A person as JSON:"), p)[0].outputs[0]
    assert o.finish_reason == "stop" and o.stop_reason == '"age"' and o.text.startswith('{"name": "')


def test_streaming_equals_whole(engine):
    p = greedy(structured_outputs={"json": SCHEMAS[1][1]})
    msgs = user("Describe a book as JSON.")
    whole = engine.chat(msgs, p)[0].outputs[0].text
    deltas = list(engine.stream(msgs, p))
    assert "".join(deltas) == whole and len(deltas) > 3
    jsonschema.validate(json.loads(whole), SCHEMAS[1][1])


def test_ends_when_the_structure_is_complete(engine):
    """ignore_eos and a large max_tokens: the sequence still ends with the last character."""
    o = engine.chat(user("Today's date?"), greedy(structured_outputs={"regex": r"\d{4}-\d{2}-\d{2}"},
                                                   ignore_eos=True, max_tokens=100))[0].outputs[0]
    assert o.finish_reason == "stop" and re.fullmatch(r"\d{4}-\d{2}-\d{2}", o.text) and len(o.token_ids) <= 10


def test_unsatisfiable_constraint_ends_its_sequence_alone(engine):
    """A grammar that compiles but cannot go on after "x" (no string is both letters and digits): its
    matcher fails at run time, the sequence is aborted after "x", and its batch-mate runs on."""
    impossible = 'start: "x" A\nA: /[a-z]+/ & /[0-9]+/'
    outs = engine.generate(["Say something:", "The history of Rome"],
                           [greedy(structured_outputs={"grammar": impossible}), greedy(max_tokens=5, ignore_eos=True)])
    assert outs[0].outputs[0].finish_reason == "abort" and outs[0].outputs[0].text == "x"
    assert outs[1].outputs[0].finish_reason == "length" and len(outs[1].outputs[0].token_ids) == 5


def test_no_token_left_fails_the_request_naming_the_fields(engine):
    """A choice of "yes" with bad_words ["yes"] forbids every token: the sampler drew token 0 from NaN
    probabilities, the grammar rejected it and the request ended "abort" (an llguidance error in the log).
    Now it fails at that step with a ValueError naming the fields (a 400 through the server), and its
    batch-mate runs on."""
    p = greedy(structured_outputs={"choice": ["yes"]}, bad_words=["yes"], max_tokens=4)
    with pytest.raises(ValueError, match="^bad_words: with structured_outputs, it forbids every token after 0 "):
        engine.generate("Say yes", p)
    engine.add_request("none-left", "Say yes", p)
    engine.add_request("mate", "Say yes", greedy(max_tokens=3, ignore_eos=True))
    ends = {}
    while engine.has_unfinished_requests():
        ends.update((o.request_id, o.outputs[0].finish_reason) for o in engine.step() if o.finished)
    assert ends == {"none-left": "error", "mate": "length"}


def test_add_request_rejects_bad_constraints(engine):
    with pytest.raises(ValueError, match="structured_outputs.regex"):
        engine.add_request("bad", "x", SamplingParams(structured_outputs={"regex": "(["}))
    assert not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="structured_outputs.json: the constraint cannot be satisfied"):
        engine.add_request("bad", "x", SamplingParams(structured_outputs={"json": {"$ref": "#"}}))  # no first token
    assert not engine.has_unfinished_requests()


def test_stats_count_constrained_requests_and_mask_time(engine):
    st = engine.stats()["structured"]
    assert st["requests"] >= len(SCHEMAS) and st["mask_count"] > 0 and st["mask_sum"] > 0
    assert st["mask_buckets"][-1][1] <= st["mask_count"] and json.dumps(st, allow_nan=False)  # plain JSON


def test_stats_count_only_admitted_requests(smollm2_gguf):
    """A constrained request refused after its grammar compiled (the KV pool cannot hold it), or one
    whose generate() call is refused for another of its prompts, is not counted; an admitted one is."""
    small = Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=4)
    so = {"json": {"type": "object"}}
    with pytest.raises(ValueError, match="max_tokens: .* KV blocks"):
        small.add_request("big", "Hi", greedy(structured_outputs=so, max_tokens=200))
    p = greedy(structured_outputs=so, max_tokens=8)
    with pytest.raises(ValueError, match="prompt: .* KV blocks"):
        small.generate(["Hi", list(range(1000, 1100))], p)
    assert small.stats()["structured"]["requests"] == 0 and not small.has_unfinished_requests()
    small.generate("Hi", p)
    assert small.stats()["structured"]["requests"] == 1


def test_constraint_starts_after_its_trigger(engine):
    """structured_outputs.start_after (a reasoning end marker's ids, as the server passes it): the
    output is free, the tokens it has without a constraint, until it holds the trigger's ids in a row;
    from the next token on the constraint applies (n > 1: each sequence watches for it alone). A
    trigger that never comes leaves the whole output free (finish_reason length)."""
    msgs = user("Why is the sky blue?")
    free = engine.chat(msgs, greedy(max_tokens=6))[0].outputs[0].token_ids
    trigger = free[1:3]
    after = greedy(n=2, max_tokens=8, structured_outputs={"regex": "[0-9]{3}", "start_after": trigger})
    never = greedy(max_tokens=6, structured_outputs={"regex": "[0-9]{3}", "start_after": [free[0]] * 3})
    outs = engine.chat([msgs, msgs], [after, never])
    prefix = engine.tokenizer.decode(free[:3])
    for o in outs[0].outputs:
        assert o.token_ids[:3] == free[:3] and o.finish_reason == "stop", o.text
        assert o.text.startswith(prefix) and re.fullmatch("[0-9]{3}", o.text[len(prefix):]), o.text
    o = outs[1].outputs[0]
    assert (o.token_ids, o.finish_reason) == (free, "length")
    with pytest.raises(ValueError, match="structured_outputs.start_after"):
        SamplingParams(structured_outputs={"regex": "a", "start_after": [-1]})


def test_trigger_survives_preemption(smollm2_gguf, engine):
    """Requests preempted (a pool too small for all of them) and recomputed keep where their trigger
    and grammar are: each output is the one it has in a pool that holds them all."""
    prompts = ["The history of Rome", "Water boils at"]
    frees = [o.outputs[0].token_ids for o in engine.generate(prompts, greedy(max_tokens=3))]
    params = [greedy(max_tokens=8, ignore_eos=True, structured_outputs={"regex": "[0-9]{2}", "start_after": f[1:3]})
              for f in frees]
    want = [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
    assert all(w[:3] == f and len(w) == 5 for w, f in zip(want, frees))   # three free tokens, then two digits
    tiny = Engine(smollm2_gguf, device="cpu", progress=False, num_kv_blocks=4, block_size=4, max_num_batched_tokens=16)
    assert [o.outputs[0].token_ids for o in tiny.generate(prompts, params)] == want
    assert tiny.stats()["num_preemptions"] > 0


def test_repeat_frees_the_output_after_each_structure(engine):
    """start_after with repeat (strict tool calls' constraint): each complete structure makes the
    sequence free again until the next trigger, and its row drops the last mask (it kept it: the free
    text after a tool call could only repeat the call's last character)."""
    tok = engine.tokenizer
    m = engine.structured.new_matcher(StructuredOutputsParams(
        regex=" [0-9]{2}", start_after=tok.encode(" PIN:", add_special_tokens=False), repeat=True))
    seq = SimpleNamespace(matcher=m, row=SimpleNamespace(packed_mask=None))   # what fill_masks reads and sets
    masked = []
    for t in tok.encode("My PIN: 42, his PIN: 17 ok", add_special_tokens=False):
        engine.structured.fill_masks([seq])
        if seq.row.packed_mask is not None:
            masked.append(tok.decode([t]))
        assert not m.accept(t)   # a complete structure does not end the sequence
    assert masked == [" ", "4", "2", " ", "1", "7"] and m.error is None and m.waiting


def test_tool_call_grammars_the_server_tests_do_not_reach(engine):
    """strict tool calls' grammars (server/tool_grammar.py) in the forms no served template writes in
    the tests: DeepSeek-V3's fenced call, Mistral v11's [CALL_ID]; a call as the template writes it
    is complete, arguments against the schema are rejected, as is a second call where calls are
    not parallel."""
    from pocketcupy.server import tool_grammar
    from pocketcupy.server.tools_deepseek import CALL_BEGIN, CALL_END, CALLS_END, SEP

    tok = engine.tokenizer
    args = {"get_weather": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"],
                            "additionalProperties": False}, "get_time": {"type": "object"}}
    fenced = CALL_BEGIN + "function" + SEP + 'get_weather\n```json\n{"unit": %s}\n```' + CALL_END
    cases = [(tool_grammar.deepseek(tok, args, True, False), fenced + CALLS_END),
             (tool_grammar.deepseek(tok, args, True, True), fenced + fenced + CALLS_END),
             (tool_grammar.mistral_v11(tok, args, True), 'get_weather[CALL_ID]a1B2c3D4e[ARGS]{"unit": %s}')]
    for grammar, form in cases:
        for unit, complete in (('"c"', True), ('"k"', False)):
            m = engine.structured.new_matcher(StructuredOutputsParams(grammar=grammar))
            done = [m.accept(t) for t in tok.encode(form.replace("%s", unit), add_special_tokens=False)]
            assert (done[-1] and m.error is None) == complete, (form, unit, m.error)
    m = engine.structured.new_matcher(StructuredOutputsParams(grammar=cases[0][0]))
    for t in tok.encode((fenced * 2).replace("%s", '"c"'), add_special_tokens=False):
        m.accept(t)
    assert m.error is not None   # (not parallel: the second call's begin marker)
