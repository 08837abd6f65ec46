"""scripts/profile_variants.py's variant specs (pure host code): parsing, clear errors, and Settings
setting the named constants of pocketcupy.backend's modules only while active."""
import pytest

from .helpers import load_script


def test_parse_and_apply_a_variant():
    from pocketcupy.backend import linear_cuda

    mod = load_script("profile_variants")
    assert mod.parse_variant("base=") == ("base", [])
    name, sets = mod.parse_variant("tall=linear_cuda.Q8_B1_TALL_ROWS=10**9; linear_cuda.Q8_B1_LONG_ROW_ROWS=8")
    assert name == "tall" and sets == [("linear_cuda", "Q8_B1_TALL_ROWS", 10 ** 9),
                                       ("linear_cuda", "Q8_B1_LONG_ROW_ROWS", 8)]
    before = (linear_cuda.Q8_B1_TALL_ROWS, linear_cuda.Q8_B1_LONG_ROW_ROWS)
    with mod.Settings(sets):
        assert (linear_cuda.Q8_B1_TALL_ROWS, linear_cuda.Q8_B1_LONG_ROW_ROWS) == (10 ** 9, 8)
    assert (linear_cuda.Q8_B1_TALL_ROWS, linear_cuda.Q8_B1_LONG_ROW_ROWS) == before


@pytest.mark.parametrize("spec, match", [("nonamehere", "NAME=ASSIGNMENTS"), ("x=Q8_B1_TALL_ROWS=3", "module.CONSTANT"),
                                         ("x=linear_cuda.Q8_B1_TALL_ROWS=big", "not a Python literal")])
def test_bad_specs_name_the_part(spec, match):
    with pytest.raises(ValueError, match=match):
        load_script("profile_variants").parse_variant(spec)


def test_unknown_constant_is_refused_before_the_model_loads():
    mod = load_script("profile_variants")
    with pytest.raises(ValueError, match="has no NOT_A_KNOB"):
        mod.Settings([("linear_cuda", "NOT_A_KNOB", 1)])
