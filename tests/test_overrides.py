"""The one settings grammar (rpc_attention.overrides): KEY=VALUE, dotted keys, YAML values, errors."""

import math

import pytest

from rpc_attention.overrides import apply_assignments, parse_assignments, parse_number, parse_value


def test_values_are_yaml_with_floats_in_exponent_form():
    assert parse_assignments(["a.b=3", "c=[0, 1]", "d=all", "e=1e-3", "f=null", "g=true", "h=", "i=2/255"]) == [
        ("a.b", 3), ("c", [0, 1]), ("d", "all"), ("e", 1e-3), ("f", None), ("g", True), ("h", ""), ("i", "2/255")]
    assert parse_value("nan") == "nan"  # not silently a float NaN
    assert parse_value("{out}/runs/x") == "{out}/runs/x"  # invalid YAML stays text


@pytest.mark.parametrize("item,needle", [("nothing", "KEY=VALUE"), ("=3", "not a dotted name"),
                                         ("a..b=3", "not a dotted name")])
def test_malformed_items_name_the_flag(item, needle):
    with pytest.raises(ValueError, match=f"--flag .*{needle}|--flag expects {needle}"):
        parse_assignments([item], "--flag")


def test_apply_keeps_known_keys_and_opens_only_open_sections():
    tree = {"train": {"epochs": 1, "ema": {"enabled": False}}, "model": {"kwargs": None}}
    out = apply_assignments(tree, [("train.epochs", 5), ("model.kwargs.n_iter", 4)], open_sections=("model.kwargs",))
    assert out["train"]["epochs"] == 5 and out["model"]["kwargs"] == {"n_iter": 4}
    assert tree["train"]["epochs"] == 1 and tree["model"]["kwargs"] is None  # input untouched
    with pytest.raises(ValueError, match=r"unknown config key 'train\.epoch'; did you mean train\.epochs"):
        apply_assignments(tree, [("train.epoch", 2)])
    with pytest.raises(ValueError, match="not a section"):
        apply_assignments(tree, [("train.epochs.x", 2)])
    with pytest.raises(ValueError, match="train.ema is a section; set one of its keys"):
        apply_assignments(tree, [("train.ema", 3)])


@pytest.mark.parametrize("text,value", [("0.01", 0.01), ("1e-3", 1e-3), ("2/255", 2 / 255), ("2.5/255", 2.5 / 255),
                                        (" 1 / 4 ", 0.25), (3, 3.0)])
def test_numbers_take_fractions(text, value):
    # float64 quotients of the same operands: exact equality up to one rounding
    assert math.isclose(parse_number(text), value, rel_tol=2 ** -52)


@pytest.mark.parametrize("text", ["abc", "1/0", "2/x", True, ""])
def test_bad_numbers_say_how_to_write_one(text):
    with pytest.raises(ValueError, match="eps"):
        parse_number(text, "eps")


def test_typed_value_checks_against_the_annotation():
    from typing import List, Optional, Tuple

    from rpc_attention.overrides import parse_assignments, typed_value

    pairs = dict(parse_assignments(["seeds=0,1,2", "eps=2/255", "limit=null", "names=[a, b]", "n=3", "on=true"]))
    assert typed_value("seeds", pairs["seeds"], List[int]) == [0, 1, 2]
    assert typed_value("eps", pairs["eps"], float) == 2 / 255
    assert typed_value("limit", pairs["limit"], Optional[int]) is None
    assert typed_value("names", pairs["names"], Tuple[str, ...]) == ("a", "b")
    assert typed_value("n", pairs["n"], int) == 3 and typed_value("on", pairs["on"], bool) is True
    for key, kind, msg in (("n", bool, "true or false"), ("on", int, "an integer"), ("names", int, "an integer"),
                           ("limit", str, "expected a value")):
        with pytest.raises(ValueError, match=msg):
            typed_value(key, pairs[key], kind)
    with pytest.raises(ValueError, match="seeds"):
        typed_value("seeds", "0,x", List[int])
