"""On a real kube-apiserver (>= 1.30): a GPU node's credentials reach only its own
objects. The device plugin's token, bound to its pod on the node as the kubelet's
token is, names that node; the chart's ValidatingAdmissionPolicy lets the plugin's
account change its own Node and the pods bound to that node, and no other Node or pod.
"""

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.cluster import ClusterError
from gpushare.kubecluster import KubeCluster
from tests.e2e.kube import run, wait_for
from tests.e2e.local import NODE, NODE_POD, SYSTEM_NAMESPACE, LocalCluster
from tests.e2e.workloads import BUSYBOX, WORKLOAD_LABEL

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(600)]

OTHER_NODE = "gpushare-e2e-other-node"
"""A Node object with no kubelet behind it: another GPU node of the cluster."""
NODE_KEY = "authentication.kubernetes.io/node-name"
NOTE = "gpushare.io/e2e-note"


@pytest.fixture(scope="module")
def scoped(local: LocalCluster) -> Iterator[LocalCluster]:
    assert local.bins is not None
    if local.bins.minor < 30:
        pytest.skip(f"no ValidatingAdmissionPolicy on {local.version} (from 1.30)")
    local.create([{"apiVersion": "v1", "kind": "Node", "metadata": {"name": OTHER_NODE}}])
    yield local
    # No kubelet ends the pods bound to the other node: force them out.
    local.kubectl("delete", "pods", "-l", WORKLOAD_LABEL, "--grace-period=0", "--force",
                  "--ignore-not-found", "--wait=true", timeout=150)  # fmt: skip
    local.kubectl("delete", "node", OTHER_NODE, "--ignore-not-found")


def as_plugin(local: LocalCluster, kubeconfig: Path | None = None) -> KubeCluster:
    """The plugin's own API adapter with its kubeconfig (its pod-bound token), or another.
    (kubectl reads an object before it patches it, which the plugin may not for nodes.)"""
    return KubeCluster.from_config(str(kubeconfig or local.our_dir / "node.kubeconfig"))


def refusal(change: Callable[[], object]) -> str:
    """'' when the change is allowed, else the API server's refusal."""
    try:
        change()
    except ClusterError as err:
        return str(err)
    return ""


def annotate_node(local: LocalCluster, name: str, kubeconfig: Path | None = None) -> str:
    plugin = as_plugin(local, kubeconfig)
    return refusal(lambda: plugin.patch_node_annotations(name, {NOTE: "plugin"}))


def annotate_pod(local: LocalCluster, name: str) -> str:
    plugin = as_plugin(local)
    return refusal(lambda: plugin.patch_pod_annotations("default", name, {NOTE: "plugin"}))


def in_force(local: LocalCluster) -> str:
    """The policy's refusal of another node's annotation, once the API server enforces
    the policy (it loads a new policy asynchronously)."""

    def refused() -> str | None:
        answer = annotate_node(local, OTHER_NODE)
        return answer if "may change only" in answer else None

    return wait_for("the policy to refuse another node's annotation", refused, 30, every=0.5)


def unbound_pod(name: str) -> dict[str, Any]:
    key, value = WORKLOAD_LABEL.split("=")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {key: value}},
        "spec": {
            "schedulerName": "nobody",  # no scheduler binds it
            "containers": [{"name": "app", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                            "command": ["sleep", "3600"]}],
            "terminationGracePeriodSeconds": 0,
        },
    }  # fmt: skip


def bound_pod(local: LocalCluster, name: str, node: str) -> None:
    """A pod created unbound, then bound to `node` by a Binding, as a scheduler does."""
    local.create([unbound_pod(name)])
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    local.create([binding])
    assert local.get("pod", name)["spec"]["nodeName"] == node


def test_the_policy_is_in_force_and_its_expressions_type_check(scoped: LocalCluster):
    in_force(scoped)
    [name] = [
        o["metadata"]["name"] for o in scoped.rendered if o["kind"] == "ValidatingAdmissionPolicy"
    ]

    def checked() -> dict[str, Any] | None:
        """The status, once kube-controller-manager has type-checked the policy."""
        status: dict[str, Any] = scoped.get("validatingadmissionpolicy", name).get("status", {})
        return status if status.get("observedGeneration") else None

    status = wait_for("the policy's type check", checked, timeout=60, every=1)
    assert not status.get("typeChecking", {}).get("expressionWarnings"), status


def test_the_plugins_token_names_its_node(scoped: LocalCluster):
    kubeconfig = str(scoped.our_dir / "node.kubeconfig")
    whoami = run(["kubectl", "--kubeconfig", kubeconfig, "auth", "whoami", "-o", "json"])
    review = json.loads(whoami.stdout)
    extra = review["status"]["userInfo"]["extra"]
    assert extra[NODE_KEY] == [NODE]
    assert extra["authentication.kubernetes.io/pod-name"] == [NODE_POD]


def test_the_plugin_annotates_its_own_node_but_no_other(scoped: LocalCluster):
    refused = in_force(scoped)
    assert f"the device plugin of node {NODE} may change only its own Node, not {OTHER_NODE}" in (
        refused
    ), refused
    assert NOTE not in scoped.get("node", OTHER_NODE)["metadata"].get("annotations", {})
    assert annotate_node(scoped, NODE) == ""
    assert scoped.get("node", NODE)["metadata"]["annotations"][NOTE] == "plugin"
    scoped.kubectl("annotate", "node", NODE, f"{NOTE}-")


def test_the_plugin_annotates_pods_bound_to_its_node_but_no_other(scoped: LocalCluster):
    in_force(scoped)
    bound_pod(scoped, "elsewhere", OTHER_NODE)
    bound_pod(scoped, "here", NODE)
    refused = annotate_pod(scoped, "elsewhere")
    assert (
        f"may change only pods bound to it, not default/elsewhere (bound to {OTHER_NODE})"
        in refused
    ), refused
    assert NOTE not in scoped.get("pod", "elsewhere")["metadata"].get("annotations", {})
    assert annotate_pod(scoped, "here") == ""
    assert scoped.get("pod", "here")["metadata"]["annotations"][NOTE] == "plugin"
    scoped.create([unbound_pod("unbound")])
    assert "not default/unbound (not bound)" in annotate_pod(scoped, "unbound")


def test_a_token_of_the_plugins_account_naming_no_node_changes_nothing(
    scoped: LocalCluster, tmp_path: Path
):
    """A token not bound to a pod, as `kubectl create token` gives by default."""
    in_force(scoped)
    account = scoped.service_account("node")
    token = scoped.kubectl("create", "token", account, "-n", SYSTEM_NAMESPACE).stdout.strip()
    config = yaml.safe_load((scoped.our_dir / "node.kubeconfig").read_text())
    config["users"][0]["user"]["token"] = token
    unbound = tmp_path / "unbound.kubeconfig"
    unbound.write_text(yaml.safe_dump(config))
    refused = annotate_node(scoped, NODE, kubeconfig=unbound)
    assert f"the device plugin's token names no node ({NODE_KEY})" in refused, refused


def test_events_are_left_to_rbac(scoped: LocalCluster):
    """They name objects but move no GPU accounting; the policy does not look at them."""
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "e2e.", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": OTHER_NODE},
        "reason": "E2E",
        "message": "an event of the plugin's account about another node",
        "type": "Normal",
    }
    kubeconfig = str(scoped.our_dir / "node.kubeconfig")
    created = run(
        ["kubectl", "--kubeconfig", kubeconfig, "create", "-f", "-"],
        stdin=json.dumps(event),
        check=False,
    )
    assert created.returncode == 0, created.stderr
