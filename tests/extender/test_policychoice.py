"""Which placement policy places a pod: the pod's annotation, else the node's label,
else the extender's default — written once, in PolicyChoice."""

import pytest

from gpushare.errors import Rule
from gpushare.extender.policychoice import POD_POLICY_ANNOTATION, PolicyChoice
from gpushare.labels import LABEL_PLACEMENT
from gpushare.placement.policies import POLICIES, BinpackPolicy

CHOICE = PolicyChoice(POLICIES, "spread")


def test_the_default_is_checked_once_and_kept_in_its_normal_form():
    assert PolicyChoice(POLICIES, "  Binpack ").default == "binpack"
    with pytest.raises(ValueError) as refused:
        PolicyChoice(POLICIES, "tetris")
    assert str(refused.value) == (
        f"--default-placement 'tetris' is not a placement policy; "
        f"known: {', '.join(sorted(POLICIES))}"
    )


def test_a_registry_without_the_default_is_refused():
    with pytest.raises(ValueError, match=r"known: binpack$"):
        PolicyChoice({"binpack": BinpackPolicy}, "spread")


def test_the_pods_annotation_comes_before_the_nodes_label():
    pod = CHOICE.of_pod({POD_POLICY_ANNOTATION: "Binpack"})
    node = CHOICE.of_node({LABEL_PLACEMENT: "spread"})
    assert (pod, node) == ("binpack", "spread")
    assert CHOICE.placing(pod, node) == "binpack"
    assert CHOICE.placing(None, node) == "spread"


def test_a_node_without_a_known_label_takes_the_default():
    assert CHOICE.of_node({}) == "spread"
    assert CHOICE.of_node({LABEL_PLACEMENT: "tetris"}) == "spread"
    assert PolicyChoice(POLICIES, "binpack").of_node({LABEL_PLACEMENT: " "}) == "binpack"


def test_a_pod_naming_no_known_policy_names_none_and_is_refused_with_the_known_ones():
    assert CHOICE.of_pod({}) is None
    assert CHOICE.of_pod({POD_POLICY_ANNOTATION: "tetris"}) is None
    assert CHOICE.refusal({}) is None
    assert CHOICE.refusal({POD_POLICY_ANNOTATION: " SPREAD"}) is None
    refusal = CHOICE.refusal({POD_POLICY_ANNOTATION: "tetris"})
    assert refusal is not None and refusal.rule is Rule.UNKNOWN_POLICY
    assert refusal.message == (
        f"pod annotation {POD_POLICY_ANNOTATION}='tetris' names no placement policy; "
        f"use one of {', '.join(sorted(POLICIES))}, or remove it"
    )


def test_each_build_makes_fresh_policy_objects_of_every_name():
    first, second = CHOICE.build(), CHOICE.build()
    assert set(first) == set(POLICIES) == CHOICE.names
    assert all(first[name] is not second[name] for name in first)
