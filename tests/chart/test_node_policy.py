"""The ValidatingAdmissionPolicy that keeps a GPU node's device plugin to its own Node
and that node's pods: rendered where the cluster has it (>= 1.30), and what it says.
What it does on a real API server: tests/e2e/test_local_node_scope.py."""

import pytest

from tests.chart.rendering import FULLNAME, NAMESPACE, dropped_fields, render

POLICY = f"{FULLNAME}-device-plugin-own-node"
ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{FULLNAME}-device-plugin"
NODE_KEY = "authentication.kubernetes.io/node-name"
KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def policy_objects(values: dict | None = None, kube_version: str = "v1.33.3") -> list[dict]:
    rendered = render(values, kube_version=kube_version)
    return [o for o in rendered.objects if o["kind"] in KINDS]


@pytest.fixture(scope="module")
def policy() -> dict:
    [policy, _] = policy_objects()
    return policy


@pytest.mark.parametrize("kube_version", ["v1.30.0", "v1.31.4", "v1.33.3", "v1.34.0-eks-1"])
def test_rendered_with_its_binding_from_1_30(kube_version):
    policy, binding = policy_objects(kube_version=kube_version)
    assert (policy["kind"], binding["kind"]) == KINDS
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == POLICY
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "paramRef" not in binding["spec"]
    for obj in (policy, binding):
        assert dropped_fields(obj) == [], obj["kind"]


@pytest.mark.parametrize("kube_version", ["v1.25.0", "v1.28.7", "v1.29.9"])
def test_not_rendered_below_1_30(kube_version):
    """admissionregistration.k8s.io/v1 has no policies there, and a pod's token names
    no node (ServiceAccountTokenPodNodeInfo: alpha and off in 1.29)."""
    assert policy_objects(kube_version=kube_version) == []


def test_turned_off_by_its_value_and_on_when_an_older_release_lacks_it():
    assert policy_objects({"devicePlugin": {"ownNodePolicy": False}}) == []
    # --reuse-values from a release before the value: the value is absent, not false.
    assert len(policy_objects({"devicePlugin": {"ownNodePolicy": None}})) == 2


def test_applies_to_the_device_plugins_account_alone(policy):
    [condition] = policy["spec"]["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username == "{ACCOUNT}"'


def test_covers_every_change_to_nodes_and_pods_and_fails_closed(policy):
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""]
    assert set(rule["operations"]) == {"UPDATE", "DELETE"}
    assert set(rule["resources"]) == {"nodes", "nodes/*", "pods", "pods/*"}


def test_the_node_comes_from_the_tokens_extra_and_a_token_without_one_is_refused(policy):
    [variable] = policy["spec"]["variables"]
    assert variable["name"] == "node"
    assert f"request.userInfo.extra['{NODE_KEY}'][0]" in variable["expression"]
    assert f"'{NODE_KEY}' in request.userInfo.extra" in variable["expression"]
    first = policy["spec"]["validations"][0]
    assert first["expression"] == "variables.node != ''"
    assert NODE_KEY in first["message"] and "\n" not in first["message"]


def test_a_node_is_its_own_and_a_pod_must_be_bound_to_it(policy):
    nodes, pods = policy["spec"]["validations"][1:]
    assert "request.resource.resource != 'nodes'" in nodes["expression"]
    assert "oldObject.metadata.name == variables.node" in nodes["expression"]
    assert "request.resource.resource != 'pods'" in pods["expression"]
    assert "oldObject.spec.nodeName == variables.node" in pods["expression"]
    for validation in (nodes, pods):
        assert validation["reason"] == "Forbidden"
        assert "may change only" in validation["messageExpression"]


def test_the_account_it_names_is_the_one_the_daemonset_runs_as():
    rendered = render(kube_version="v1.33.3", namespace="gpu", release="other")
    daemonset = rendered.one("DaemonSet")
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    [condition] = rendered.one("ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    assert f'"system:serviceaccount:gpu:{account}"' in condition["expression"]


def test_the_notes_say_what_stays_open_below_1_30_and_nothing_from_it():
    assert "below 1.30" in render(kube_version="v1.29.9").notes
    assert "below 1.30" not in render(kube_version="v1.30.0").notes
    off = render({"devicePlugin": {"ownNodePolicy": False}}, kube_version="v1.29.9")
    assert "below 1.30" not in off.notes
