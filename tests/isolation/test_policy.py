"""Per-GPU settings: their rules, and how weight units are handed out."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.isolation.policy import (
    InvalidSetting,
    Policy,
    grant_weights,
    parse_highprio,
    parse_max_inst,
    parse_policy,
    parse_prio_ratio,
    parse_weight,
)


def test_weights_are_granted_in_arrival_order_while_units_last():
    granted = grant_weights(5, [("a", 2), ("b", 2), ("c", 2), ("d", 1)])
    assert granted == {"a": 2, "b": 2, "c": 1, "d": 0}


@given(
    max_inst=st.integers(1, 25),
    wanted=st.lists(st.integers(1, 25), max_size=30),
)
def test_grants_never_exceed_max_inst_nor_what_was_asked(max_inst, wanted):
    requests = [(str(i), w) for i, w in enumerate(wanted)]
    granted = grant_weights(max_inst, requests)
    assert sum(granted.values()) <= max_inst
    assert all(0 <= granted[key] <= w for key, w in requests)
    # Nobody later gets units while an earlier one got less than it asked for.
    short = [i for i, (key, w) in enumerate(requests) if granted[key] < w]
    if short:
        assert all(granted[key] == 0 for key, _ in requests[short[0] + 1 :])


@pytest.mark.parametrize(
    ("parse", "raw", "value"),
    [
        (parse_policy, "2\n", Policy.WEIGHTED),
        (parse_policy, " 0 ", Policy.FAIR_SHARE),
        (parse_max_inst, "25", 25),
        (parse_max_inst, "1\n", 1),
        (parse_prio_ratio, "20", 20),
        (parse_prio_ratio, "99", 99),
        (parse_highprio, "1\n", True),
        (parse_highprio, "0", False),
    ],
)
def test_valid_values_parse(parse, raw, value):
    assert parse(raw) == value


@pytest.mark.parametrize(
    ("parse", "raw", "message"),
    [
        (parse_policy, "6", "policy must be one of 0 fair-share"),
        (parse_policy, "", "policy was written empty"),
        (parse_max_inst, "26", "max_inst must be in 1..25; got 26"),
        (parse_max_inst, " \n", "max_inst was written empty; write a whole number"),
        (parse_max_inst, "16.5", "max_inst must be a whole number; got '16.5'"),
        (parse_prio_ratio, "19", "prio_ratio must be in 20..99; got 19"),
        (parse_prio_ratio, "50%", "prio_ratio must be a whole number; got '50%'"),
        (parse_highprio, "yes", "highprio must be a whole number"),
        (parse_highprio, "2", "highprio must be 0 or 1; got 2"),
    ],
)
def test_invalid_values_name_the_rule(parse, raw, message):
    with pytest.raises(InvalidSetting, match=re.escape(message)):
        parse(raw)


def test_weight_is_bounded_by_max_inst():
    assert parse_weight("4", max_inst=4) == 4
    with pytest.raises(InvalidSetting, match=re.escape("weight must be in 1..4; got 5")):
        parse_weight("5", max_inst=4)
