"""Structured-output constraints without a model: StructuredOutputsParams validation (bad schemas,
regexes, grammars and choices raise ValueError naming the field), packed token masks (the padded
logits of a model whose tokenizer is smaller are forbidden), and the NumPy sampler and the CUDA
sampler's host packing taking a packed mask as they take the equivalent bool mask."""
import numpy as np
import pytest

from pocketcupy.backend.sampler_cuda import PackedBatch, pack_mask
from pocketcupy.sampler import Sampler, SamplingRow, unpack_mask
from pocketcupy.sampling import SamplingParams
from pocketcupy.structured import StructuredOutputsParams

ARITH_LARK = """
start: expr
expr: term (("+" | "-") term){0,3}
term: factor (("*" | "/") factor){0,2}
factor: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,3}/
"""


@pytest.mark.parametrize("spec", [
    {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}},
    {"json": '{"type": "array", "items": {"type": "string"}}'},
    {"json": True},
    {"regex": r"\d{4}-\d{2}-\d{2}"},
    {"choice": ["yes", "no", 'a "quoted" one']},
    {"grammar": ARITH_LARK},
    {"grammar": 'root ::= [0-9]+ ("+" [0-9]+)*'},
    {"json": {"type": "integer", "minimum": 0, "maximum": 2 ** 63 - 1}},  # an upper bound that high only narrows
])
def test_valid_constraints(spec):
    so = StructuredOutputsParams(**spec)
    assert so.kind == next(iter(spec)) and so.ll_grammar
    p = SamplingParams(structured_outputs=spec)  # a dict works too
    assert p.structured_outputs == so and p.clone(max_tokens=5).structured_outputs == so


@pytest.mark.parametrize("spec,match", [
    ({}, "exactly one of json, regex, choice, grammar must be given, got none"),
    ({"json": True, "regex": "a"}, "got json, regex"),
    ({"json": {"type": "foo"}}, r"structured_outputs\.json: .*foo"),
    ({"json": "{not json"}, r"structured_outputs\.json: not valid JSON"),
    ({"json": [1, 2]}, r"structured_outputs\.json: must be a JSON schema object"),
    ({"json": False}, r"structured_outputs\.json"),
    ({"json": {"type": "string", "pattern": "a(b"}}, r"structured_outputs\.json: .*unclosed group"),
    ({"json": {"type": "array", "uniqueItems": True}}, r"structured_outputs\.json: .*uniqueItems"),
    ({"regex": "a(b"}, r"structured_outputs\.regex: .*unclosed group"),
    ({"regex": "a\\"}, r"structured_outputs\.regex: .*ends with an unescaped backslash"),
    ({"json": {"type": "string", "pattern": "[0-9]+\\"}}, r"structured_outputs\.json: .*unescaped backslash"),
    ({"json": {"type": "object", "patternProperties": {"a\\": {}}}}, r"structured_outputs\.json: .*unescaped backslash"),
    ({"regex": ""}, r"structured_outputs\.regex: must be a non-empty string"),
    ({"regex": 5}, r"structured_outputs\.regex"),
    ({"choice": []}, r"structured_outputs\.choice: must be a non-empty list"),
    ({"choice": ["a", 1]}, r"structured_outputs\.choice: entries must be non-empty strings"),
    ({"choice": "yes"}, r"structured_outputs\.choice"),
    ({"grammar": "start: foo"}, r"structured_outputs\.grammar: .*unknown name"),
    ({"grammar": "root ::= foo"}, r"structured_outputs\.grammar: .*foo"),
    ({"grammar": 'root ::= ("a"'}, r"structured_outputs\.grammar"),
    ({"json": True, "whitespace_flexible": "yes"}, r"structured_outputs\.whitespace_flexible"),
    # llguidance clamps integer ranges to 64 bits: this one gave 9223372036854775807 with finish_reason "stop"
    ({"json": {"type": "integer", "minimum": 1e308, "maximum": 1e308}}, r"structured_outputs\.json: 'minimum'"),
    ({"json": {"type": "integer", "minimum": 2 ** 53 + 1, "maximum": 2 ** 53 + 1}}, r"json: 'minimum'.*2\^53"),
    ({"json": {"properties": {"n": {"type": "integer", "exclusiveMaximum": -1e20}}}}, r"json: 'exclusiveMaximum'"),
])
def test_bad_constraints_name_the_field(spec, match):
    with pytest.raises(ValueError, match="(?s)" + match):
        StructuredOutputsParams(**spec)
    with pytest.raises(ValueError, match="(?s)" + match):
        SamplingParams(structured_outputs=spec)


def test_bad_structured_outputs_values():
    with pytest.raises(ValueError, match="structured_outputs: unknown field"):
        SamplingParams(structured_outputs={"jsn": True})
    with pytest.raises(ValueError, match="structured_outputs: must be"):
        SamplingParams(structured_outputs="json")


def test_pack_unpack_roundtrip():
    rng = np.random.default_rng(0)
    for V in (1, 31, 32, 33, 1000, 49152):
        m = rng.random(V) < 0.3
        assert np.array_equal(unpack_mask(pack_mask(m, V), V), m)
    with pytest.raises(ValueError, match="packed_mask"):
        unpack_mask(np.zeros(3, np.uint32), 1000)


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf):
    from pocketcupy.tokenizer import Tokenizer

    return Tokenizer.from_gguf(smollm2_gguf)


def test_masks_forbid_ids_past_the_tokenizer(tokenizer):
    """A model whose logits are wider than its tokenizer (padded vocabularies): the extra ids are
    never allowed (whole padding words, and the padding bits of a partly used last word)."""
    from pocketcupy.structured.manager import StructuredOutputManager

    V = tokenizer.vocab_size
    for width in (V, V + 17, V + 64 + 5):
        mgr = StructuredOutputManager(tokenizer, width)
        so = StructuredOutputsParams(json=True)
        mgr.prepare(so)
        seq = type("Seq", (), {})()
        seq.matcher, seq.row = mgr.new_matcher(so), SamplingRow(SamplingParams())
        seq.matcher.ll.consume_tokens(tokenizer.encode('{"a": ', add_special_tokens=False))
        mgr.fill_masks([seq])
        allowed = unpack_mask(seq.row.packed_mask, width)
        assert allowed[:V].sum() > 10 and not allowed[V:].any()
        assert mgr.stats.snapshot()["mask_count"] == 1
    narrow = StructuredOutputManager(tokenizer, V - 40)  # a tokenizer wider than the logits: cut to them
    narrow.prepare(so)
    seq.matcher, seq.row = narrow.new_matcher(so), SamplingRow(SamplingParams())
    narrow.fill_masks([seq])
    assert seq.row.packed_mask.shape == ((V - 40 + 31) // 32,)


@pytest.mark.parametrize("spec,text", [
    ({"choice": ["<filename>"]}, "<filename>"),
    ({"json": {"const": "a <|im_end|> b"}}, '"a <|im_end|> b"'),
    ({"regex": r"<\|im_start\|>[0-9]"}, None),
])
def test_special_token_literals_are_spelled_as_text(tokenizer, spec, text):
    """Text a grammar forces that holds a special token's literal: the masks never allow the special
    token (llguidance tokenizes forced bytes with our encode(), which parses special tokens; the
    matcher then rejected that token and the request was aborted), and ordinary tokens spell it."""
    from pocketcupy.structured.manager import StructuredOutputManager

    mgr = StructuredOutputManager(tokenizer, tokenizer.vocab_size)
    so = StructuredOutputsParams(**spec)
    mgr.prepare(so)
    seq = type("Seq", (), {})()
    seq.matcher, seq.row = mgr.new_matcher(so), SamplingRow(SamplingParams())
    ids = []
    for _ in range(30):
        mgr.fill_masks([seq])
        allowed = np.flatnonzero(unpack_mask(seq.row.packed_mask, tokenizer.vocab_size))
        assert seq.matcher.error is None and not set(allowed.tolist()) & tokenizer.special_token_ids
        ids.append(int(max(allowed, key=lambda t: len(tokenizer.token_bytes(t)))))  # the longest token
        if seq.matcher.accept(ids[-1]):
            break
    assert seq.matcher.error is None and seq.matcher.ll.is_stopped()
    assert tokenizer.decode(ids) == text if text else tokenizer.decode(ids).startswith("<|im_start|>")


def test_allow_only_rewrites_a_row():
    from pocketcupy.structured.masks import allow_only

    words = np.full(40, 0xFFFFFFFF, np.uint32)
    allow_only(words, 1000)
    assert np.flatnonzero(unpack_mask(words, 1270)).tolist() == [1000]


def test_compiled_grammars_are_cached(tokenizer):
    from pocketcupy.structured.manager import StructuredOutputManager

    mgr = StructuredOutputManager(tokenizer, tokenizer.vocab_size)
    a, b = StructuredOutputsParams(regex="[0-9]+"), StructuredOutputsParams(regex="[0-9]+")
    assert mgr._compiled_matcher(a) is mgr._compiled_matcher(b)
    m1, m2 = mgr.new_matcher(a), mgr.new_matcher(a)
    assert m1.ll is not m2.ll  # every sequence has its own state
    digit = tokenizer.encode("7", add_special_tokens=False)[0]
    assert not m1.accept(digit) and m2.ll.is_accepting() is False


@pytest.mark.parametrize("spec,match", [
    ({"json": {"$ref": "#"}}, "the constraint cannot be satisfied"),   # no output matches it
    ({"regex": "[^\\x00-\\x{10FFFF}]"}, "the constraint cannot be satisfied"),
    # satisfiable, but past llguidance's lexer limits: it was called unsatisfiable
    ({"regex": "(.{1,100}){100}"}, r"the constraint is too complex .*too many expressions"),
])
def test_constraints_failing_against_the_tokenizer_say_why(tokenizer, spec, match):
    from pocketcupy.structured.manager import StructuredOutputManager

    mgr = StructuredOutputManager(tokenizer, tokenizer.vocab_size)
    with pytest.raises(ValueError, match=f"^structured_outputs.{next(iter(spec))}: {match}"):
        mgr.prepare(StructuredOutputsParams(**spec))


def test_gbnf_unicode_escapes(tokenizer):
    """GBNF's \\uXXXX / \\UXXXXXXXX escapes, in character classes and strings, mean their characters
    (llguidance's GBNF converter made [\\u0041-\\u005A] an invalid regex: a 400 for a valid grammar);
    an escaped backslash before 'u' stays a backslash."""
    from pocketcupy.structured.manager import StructuredOutputManager

    mgr = StructuredOutputManager(tokenizer, tokenizer.vocab_size)
    grammar = r'root ::= [\u0041-\u005A] "\u00e9" [\U0001F600-\U0001F64F] ("\\u0041")?'
    for text, ok in (("Q\u00e9\U0001F600", True), ("Q\u00e9\U0001F600\\u0041", True), ("q\u00e9\U0001F600", False),
                     ("QA\U0001F600", False)):
        m = mgr.new_matcher(StructuredOutputsParams(grammar=grammar))
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert (m.valid_prefix(ids) == len(ids)) == ok, text


def test_roots_per_thread_give_the_same_masks(tokenizer):
    """Sequences take the grammar's compiled roots in turn (one per fill thread); the masks are the
    ones a single root gives, whatever the order of the rows."""
    from pocketcupy.structured.manager import StructuredOutputManager

    so = StructuredOutputsParams(json={"type": "object", "properties": {"n": {"type": "integer"}},
                                       "required": ["n"]})
    prefixes = ['{"n": ', '{', '{"n": 12', "", '{"n": 3}']
    masks = {}
    for threads in (1, 3):
        mgr = StructuredOutputManager(tokenizer, tokenizer.vocab_size)
        mgr.threads = threads
        mgr.prepare(so)
        seqs = []
        for text in prefixes:
            seq = type("Seq", (), {})()
            seq.matcher, seq.row = mgr.new_matcher(so), SamplingRow(SamplingParams())
            seq.matcher.ll.consume_tokens(tokenizer.encode(text, add_special_tokens=False))
            seqs.append(seq)
        assert [s.matcher.root for s in seqs] == [i % threads for i in range(len(prefixes))]
        assert len(mgr._compiled[so.ll_grammar]) == threads
        mgr.fill_masks(seqs)
        masks[threads] = [s.row.packed_mask for s in seqs]
    for one, three in zip(masks[1], masks[3]):
        np.testing.assert_array_equal(one, three)


def _masked_rows(rng, V, B=6):
    bools = [rng.random(V) < 0.05 for _ in range(B)]
    packed = [pack_mask(m, V) for m in bools]
    params = [SamplingParams(temperature=0.0 if b % 2 else 0.9, seed=b, logprobs=3 if b % 3 == 0 else None)
              for b in range(B)]
    as_bool = [SamplingRow(p, allowed_mask=m) for p, m in zip(params, bools)]
    as_packed = [SamplingRow(p, packed_mask=w) for p, w in zip(params, packed)]
    return bools, as_bool, as_packed


@pytest.mark.parametrize("V", [1000, 49152, 1003])
def test_sampler_takes_packed_masks(V):
    rng = np.random.default_rng(V)
    bools, as_bool, as_packed = _masked_rows(rng, V)
    x = rng.standard_normal((len(bools), V)).astype(np.float32) * 3
    a, b = Sampler([0])(x, as_bool), Sampler([0])(x, as_packed)
    assert np.array_equal(a.token_ids, b.token_ids)
    assert all(m[t] for m, t in zip(bools, b.token_ids))
    for la, lb in zip(a.logprobs, b.logprobs):
        assert (la is None) == (lb is None)
        if la is not None:
            assert {k: v.logprob for k, v in la.items()} == {k: v.logprob for k, v in lb.items()}
    with pytest.raises(ValueError, match="allows no token"):
        Sampler()(x[:1], [SamplingRow(SamplingParams(), packed_mask=np.zeros((V + 31) // 32, np.uint32))])


def test_cuda_host_packing_takes_packed_masks_as_is():
    """The device sampler's one upload carries the packed words unchanged (no bool round trip)."""
    rng = np.random.default_rng(1)
    V = 1003
    _, as_bool, as_packed = _masked_rows(rng, V)
    a, b = PackedBatch(as_bool, V, [0]), PackedBatch(as_packed, V, [0])
    assert np.array_equal(a.host, b.host) and b.n_masks == len(as_packed)
    both = SamplingRow(SamplingParams(), allowed_mask=np.arange(V) % 2 == 0, packed_mask=pack_mask(np.arange(V) < 10, V))
    c = PackedBatch([both], V, [0])
    got = c.host[-c.mask_words:].view(np.uint32)
    assert np.array_equal(unpack_mask(got, V), (np.arange(V) < 10) & (np.arange(V) % 2 == 0))
    with pytest.raises(ValueError, match="packed_mask"):
        PackedBatch([SamplingRow(SamplingParams(), packed_mask=np.ones(3, np.uint32))], V, [0])
