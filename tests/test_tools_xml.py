"""Qwen's XML tool-call form (tools_xml.parse_xml_call): values typed by the schema, and never a
value JSON cannot carry (NaN, the infinities), which would make the arguments invalid JSON."""
import json

import pytest

from pocketcupy.server.tools_xml import parse_xml_call

SCHEMAS = {"f": {"type": "object", "properties": {"x": {"type": "number"}, "o": {"type": "object"},
                                                  "n": {"type": "integer"}}}}


def _call(**values) -> dict:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    name, args = parse_xml_call(f"\n<function=f>\n{params}</function>\n", SCHEMAS)
    assert name == "f"
    return json.loads(args, parse_constant=lambda c: pytest.fail(f"{c} in the arguments"))


def test_values_are_typed_by_the_schema():
    assert _call(x="2.5", o='{"a": [1, 2]}', n="7") == {"x": 2.5, "o": {"a": [1, 2]}, "n": 7}


@pytest.mark.parametrize("number", ["inf", "-Infinity", "nan", "1e999"])
def test_non_finite_numbers_stay_text(number):
    assert _call(x=number) == {"x": number}


@pytest.mark.parametrize("obj", ['{"a": NaN}', '{"a": Infinity}', '{"a": 1e999}'])
def test_objects_with_non_finite_numbers_stay_text(obj):
    assert _call(o=obj) == {"o": obj}
