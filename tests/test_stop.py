import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pocketcupy.stop import StopStringMatcher


def reference(text, stops, include):
    """The first stop to complete (longest on ties); returns (expected output, hit)."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            s = max(done, key=len)
            return text[: end if include else end - len(s)], True
    return text, False


def stream(text, cuts, stops, include):
    m = StopStringMatcher(stops, include)
    bounds = [0, *sorted(set(cuts)), len(text)]
    expected, _ = reference(text, stops, include)
    emitted = ""
    for a, b in zip(bounds, bounds[1:]):
        out, hit = m.push(text[a:b])
        emitted += out
        assert expected.startswith(emitted)  # never emit anything that is later cut away
        if hit:
            return emitted, True, m
    emitted += m.flush()
    return emitted, False, m


def test_basic_hold_and_release():
    m = StopStringMatcher(["</s>"])
    assert m.push("Hello <") == ("Hello ", False)
    assert m.push("/") == ("", False)
    assert m.push("b>") == ("</b>", False)
    assert m.push(" x</") == (" x", False)
    assert m.push("s> tail") == ("", True)
    assert m.matched == "</s>" and m.stopped
    assert m.push("more") == ("", True)
    assert m.flush() == ""


def test_include_stop_str():
    m = StopStringMatcher(["STOP"], include_stop_str_in_output=True)
    assert m.push("aST") == ("aST", False)
    assert m.push("OPxyz") == ("OP", True)


def test_flush_returns_held_text():
    m = StopStringMatcher(["abc"])
    assert m.push("xxab") == ("xx", False)
    assert m.flush() == "ab"
    assert m.flush() == ""


def test_no_stops_passthrough():
    m = StopStringMatcher([])
    assert m.push("abc") == ("abc", False)
    assert m.flush() == ""


def test_stop_inside_single_delta_and_empty_delta():
    m = StopStringMatcher(["\n\n", "###"])
    assert m.push("") == ("", False)
    assert m.push("one\ntwo###three\n\n") == ("one\ntwo", True)
    assert m.matched == "###"


def test_first_completed_stop_wins():
    # "c" completes before "abcd" would, whatever the split
    for cuts in ([], [1], [2], [3], [1, 2, 3]):
        out, hit, m = stream("xabcd", cuts, ["abcd", "c"], False)
        assert (out, hit, m.matched) == ("xab", True, "c")
    # same end: the longer stop (earlier start) wins
    out, hit, m = stream("xabc", [2], ["bc", "abc"], False)
    assert (out, hit, m.matched) == ("x", True, "abc")


def test_unchecked_text_never_fires():
    """push(check=False) (min_tokens not reached): stops in that text never fire later; one that
    ends in a checked delta does, even if it began in unchecked text (held back, not emitted)."""
    m = StopStringMatcher([",", "ab c"])
    assert m.push("x, a", check=False) == ("x, ", False)
    assert m.push("b c", check=True) == ("", True) and m.matched == "ab c"
    m = StopStringMatcher([",", "xyz"])
    assert m.push("1, 2,", check=False) == ("1, 2,", False)
    assert m.push(" 3") == (" 3", False)
    assert m.push(",") == ("", True) and m.matched == ","


def test_rejects_empty_stop():
    with pytest.raises(ValueError):
        StopStringMatcher(["ok", ""])


alphabet = st.sampled_from("ab\n")
texts = st.text(alphabet, max_size=40)
stop_lists = st.lists(st.text(alphabet, min_size=1, max_size=4), min_size=1, max_size=3)


@settings(max_examples=500, deadline=None)
@given(texts, stop_lists, st.lists(st.integers(0, 40), max_size=12), st.booleans())
def test_stream_matches_reference(text, stops, cuts, include):
    cuts = [c for c in cuts if c <= len(text)]
    expected, expected_hit = reference(text, stops, include)
    emitted, hit, m = stream(text, cuts, stops, include)
    assert hit == expected_hit
    assert emitted == expected
    if not include:
        assert not any(s in emitted for s in stops)


@settings(max_examples=200, deadline=None)
@given(texts, stop_lists, st.booleans())
def test_char_by_char_equals_one_shot(text, stops, include):
    one = stream(text, [], stops, include)[:2]
    chars = stream(text, range(len(text)), stops, include)[:2]
    assert one == chars
