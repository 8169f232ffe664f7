"""The chart's RBAC is exactly what the components' code asks of the API server:
a new call without a rule fails here, and so does a rule no call needs. In DRA mode
(dra.enabled) the DRA driver's account and the extender's resource.k8s.io calls count
too (DRA-INTERFACES §8)."""

import pytest

from tests.chart.api_access import (
    Grant,
    adapter_grants,
    adapter_requests,
    difference,
    modules,
    needed,
    port_references,
    rule_grants,
)
from tests.chart.rendering import FULLNAME, render

COMPONENTS = ("deviceplugin", "extender", "draplugin")
DEVICE_PLUGIN = f"{FULLNAME}-device-plugin"
DRA_PLUGIN = f"{FULLNAME}-dra-plugin"
RESOURCE = "resource.k8s.io"

NOT_THE_CLUSTER: dict[str, set[str]] = {}
"""Per component package, port method names its code calls on something that is not
the cluster (none today). The scan counts a call only on a receiver named `cluster`."""


@pytest.fixture(scope="module")
def default():
    return render()


@pytest.fixture(scope="module")
def dra():
    return render({"dra": {"enabled": True}}, kube_version="v1.36.0")


def dra_mode_only(grants: frozenset[Grant]) -> frozenset[Grant]:
    """The extender's resource.k8s.io calls: its --dra-claims webhook's, which the chart
    passes only in DRA mode (tests/chart/test_dra.py)."""
    return frozenset(g for g in grants if g.group == RESOURCE)


def test_each_port_method_makes_the_requests_rbac_must_allow():
    assert adapter_grants("patch_node_annotations") == {Grant("", "nodes", "patch")}
    assert adapter_grants("list_nodes") == {Grant("", "nodes", "list")}
    assert adapter_grants("watch_pods") == {Grant("", "pods", "watch")}
    assert adapter_grants("record_event") == {Grant("", "events", "create")}
    # A bind that conflicts reads the pod to say where it went.
    assert adapter_grants("bind_pod") == {
        Grant("", "pods/binding", "create"),
        Grant("", "pods", "get"),
    }
    assert adapter_grants("delete_lease") == {Grant("coordination.k8s.io", "leases", "delete")}
    # The DRA port: a node's slices go as one collection.
    assert adapter_grants("delete_resource_slices") == {
        Grant(RESOURCE, "resourceslices", "deletecollection")
    }
    assert adapter_grants("get_resource_claim") == {Grant(RESOURCE, "resourceclaims", "get")}
    assert adapter_grants("create_resource_claim_template") == {
        Grant(RESOURCE, "resourceclaimtemplates", "create")
    }


def test_a_scoped_list_or_watch_carries_its_field_selector():
    """RBAC cannot require the selectors; the requests carry them all the same."""
    nodes = [url for _, url in adapter_requests("watch_nodes")]
    assert nodes and all("fieldSelector=metadata.name%3Dnode-a" in url for url in nodes)
    pods = [url for _, url in adapter_requests("list_pods")]
    assert pods and all("fieldSelector=spec.nodeName%3Dnode-a" in url for url in pods)
    for method in ("list_resource_slices", "delete_resource_slices"):
        slices = [url for _, url in adapter_requests(method)]
        assert slices and all(
            "spec.driver%3Dgpu.gpushare.io" in url and "spec.nodeName%3Dnode-a" in url
            for url in slices
        ), method


def test_the_scan_counts_every_use_of_the_cluster_and_nothing_else():
    source = """
def run(cluster, cache, dra, drawer):
    cluster.get_pod("ns", "a")
    handlers = (self._cluster.list_pods, self.cluster.watch_pods)
    cache.get_node("n")
    self._dra.get_resource_claim("ns", "c")
    drawer.list_resource_slices()
"""
    on_cluster, elsewhere = port_references(source)
    assert on_cluster == {"get_pod", "list_pods", "watch_pods", "get_resource_claim"}
    assert elsewhere == {"get_node", "list_resource_slices"}


@pytest.mark.parametrize("package", COMPONENTS)
def test_components_reach_the_api_through_the_port_alone(package):
    for path in modules(package):
        text = path.read_text()
        assert "import kubernetes" not in text and "from kubernetes" not in text, path
        elsewhere = port_references(text)[1] - NOT_THE_CLUSTER.get(package, set())
        assert not elsewhere, f"{path}: {elsewhere} called on something not named *cluster"


def test_device_plugin_rules_are_exactly_its_calls(default):
    [role] = [r for r in default.all("ClusterRole") if r["metadata"]["name"] == DEVICE_PLUGIN]
    granted, wanted = rule_grants(role["rules"]), needed("deviceplugin")
    assert granted == wanted, difference(granted, wanted)
    # and that is: its node's pods and its own node, read and annotated; events.
    assert wanted == {
        *(Grant("", "pods", verb) for verb in ("get", "list", "watch", "patch")),
        *(Grant("", "nodes", verb) for verb in ("list", "watch", "patch")),
        Grant("", "events", "create"),
    }


def test_device_plugin_holds_no_other_role(default):
    bound = [
        b["roleRef"]["name"]
        for b in [*default.all("ClusterRoleBinding"), *default.all("RoleBinding")]
        if any(s["name"] == DEVICE_PLUGIN for s in b["subjects"])
    ]
    assert bound == [DEVICE_PLUGIN]


def test_extender_rules_are_exactly_its_calls(default):
    """The extender's own role; kube-scheduler in the same pod has the built-in ones."""
    role = default.one("ClusterRole", f"{FULLNAME}-scheduler-extender")
    calls = needed("extender")
    granted, wanted = rule_grants(role["rules"]), calls - dra_mode_only(calls)
    assert granted == wanted, difference(granted, wanted)


def test_extender_rules_in_dra_mode_are_exactly_its_calls(dra):
    role = dra.one("ClusterRole", f"{FULLNAME}-scheduler-extender")
    granted, wanted = rule_grants(role["rules"]), needed("extender")
    assert granted == wanted, difference(granted, wanted)
    # and DRA mode adds the claim templates its webhook makes.
    assert dra_mode_only(wanted) == {Grant(RESOURCE, "resourceclaimtemplates", "create")}


def test_dra_driver_rules_are_exactly_its_calls(dra):
    role = dra.one("ClusterRole", DRA_PLUGIN)
    granted, wanted = rule_grants(role["rules"]), needed("draplugin")
    assert granted == wanted, difference(granted, wanted)
    # and that is: its node's slices, the claims it prepares, its Node and their pods.
    assert {g.resource for g in wanted} == {"resourceslices", "resourceclaims", "nodes", "pods"}


def test_dra_driver_holds_no_other_role(dra):
    bound = [
        b["roleRef"]["name"]
        for b in [*dra.all("ClusterRoleBinding"), *dra.all("RoleBinding")]
        if any(s["name"] == DRA_PLUGIN for s in b["subjects"])
    ]
    assert bound == [DRA_PLUGIN]
