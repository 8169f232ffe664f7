"""The chart's DRA mode (dra.*): gpushare's DRA driver gpu.gpushare.io on the nodes
labelled gpushare.io/driver=dra, the device plugin on the others, never both on one
node; what the driver runs with; what the cluster must serve; and nothing of it
without dra.enabled. Rendered by Helm's own engine (rendering.py); the wire facts
are DRA-INTERFACES §1 (kubelet paths), §3 (CDI, slice wiping), §5 (gates), §8 (RBAC)."""

import json
import re
from typing import Any

import helm_python as helm
import pytest
import yaml

from gpushare.extender.metrics import Verb
from tests.chart.rendering import (
    CHART,
    CUSTOM_KINDS,
    FULLNAME,
    LIVE_CLUSTER,
    NAMESPACE,
    Rendered,
    container,
    dropped_fields,
    flags,
    render,
    scheduler_config,
)
from tests.extender.test_scheduler_config import EXTENDER_KEYS

DRIVER = "gpu.gpushare.io"
DRIVER_LABEL = "gpushare.io/driver"
DRA = {"dra": {"enabled": True}}
WHOLE_GPUS = {"dra": {"enabled": True, "sharing": False}}
WITH_GATE = {"dra": {"enabled": True, "consumableCapacityGate": True}}
V134, V135, V136 = "v1.34.2", "v1.35.0", "v1.36.0"
DRA_NODE = f"{FULLNAME}-dra-node"
NODE = f"{FULLNAME}-node"
DRA_ACCOUNT = f"{FULLNAME}-dra-plugin"
SCHEDULER = f"{FULLNAME}-scheduler"
HOOK = f"{FULLNAME}-uninstall-cleanup"
POLICY = f"{DRA_ACCOUNT}-own-node"
NODE_KEY = "authentication.kubernetes.io/node-name"
DEVICE_CLASS_KIND = "resource.k8s.io/v1/DeviceClass"
"""What a live API server's discovery lists where it serves resource.k8s.io/v1."""


def merged(*parts: dict) -> dict:
    """Values merged key by key, later parts winning."""
    result: dict = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(result.get(key), dict):
                result[key] = merged(result[key], value)
            else:
                result[key] = value
    return result


def dra(values: dict | None = None, kube_version: str = V136, **kwargs: Any) -> Rendered:
    return render(merged(DRA, values or {}), kube_version=kube_version, **kwargs)


def flat(text: str) -> str:
    return " ".join(text.split())


def pod_spec(rendered: Rendered, name: str) -> dict:
    return rendered.one("DaemonSet", name)["spec"]["template"]["spec"]


def driver(rendered: Rendered) -> dict:
    return container(pod_spec(rendered, DRA_NODE), "dra-plugin")


@pytest.fixture(scope="module")
def on_136() -> Rendered:
    return dra()


# ----- the objects


DRA_VALUE_SETS = {
    "1.36": (DRA, V136),
    "whole-gpus-1.34": (WHOLE_GPUS, V134),
    "gate-1.35": (WITH_GATE, V135),
    "mock": (merged(DRA, {"gpu": {"backend": "mock", "mockGpus": "2x16GiB"}}), V136),
    "driver-root": (merged(DRA, {"gpu": {"driverRoot": "/run/nvidia/driver"}}), V136),
    "service-monitor": (merged(DRA, {"metrics": {"serviceMonitor": {"enabled": True}}}), V136),
    "minimal": (
        merged(
            DRA,
            {
                "isolation": {"enabled": False},
                "webhook": {"enabled": False},
                "dra": {"metricsPort": 0, "ownNodePolicy": False},
            },
        ),
        V136,
    ),
}


@pytest.mark.parametrize(("values", "kube_version"), DRA_VALUE_SETS.values(), ids=DRA_VALUE_SETS)
def test_every_object_loads_into_the_kubernetes_api_models(values, kube_version):
    rendered = render(values, kube_version=kube_version)
    assert rendered.one("DaemonSet", DRA_NODE)
    for obj in rendered.objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        assert dropped_fields(obj) == [], f"{where} has fields the API does not know"


@pytest.mark.parametrize(("values", "kube_version"), DRA_VALUE_SETS.values(), ids=DRA_VALUE_SETS)
def test_helm_lint_is_clean(values, kube_version):
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=kube_version)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_device_class_selects_the_drivers_devices_and_names_no_extended_resource(on_136):
    """KEP-5004 would read aliyun.com/gpu-mem: 4 as four devices (DRA-INTERFACES §7)."""
    device_class = on_136.one("DeviceClass", DRIVER)
    assert device_class["apiVersion"] == "resource.k8s.io/v1"
    assert "namespace" not in device_class["metadata"]
    assert device_class["spec"] == {
        "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
    }


def test_the_chart_names_the_driver_the_code_names():
    claims = pytest.importorskip("gpushare.dra.claims")
    assert (claims.DRIVER, claims.DEVICE_CLASS) == (DRIVER, DRIVER)


# ----- which node runs which


def term_matches(term: dict, labels: dict[str, str]) -> bool:
    """One nodeSelectorTerm as the scheduler reads it: every expression holds."""
    for expression in term["matchExpressions"]:
        present = expression["key"] in labels
        value = labels.get(expression["key"])
        operator = expression["operator"]
        if operator == "In" and not (present and value in expression["values"]):
            return False
        if operator == "NotIn" and present and value in expression["values"]:
            return False
        assert operator in ("In", "NotIn"), operator
    return True


def runs_on(rendered: Rendered, labels: dict[str, str]) -> set[str]:
    """The chart's DaemonSets whose pods a node of these labels gets (terms are ORed)."""
    found = set()
    for daemonset in rendered.all("DaemonSet"):
        affinity = daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        if any(term_matches(t, labels) for t in terms):
            found.add(daemonset["metadata"]["name"])
    return found


NODES = [
    ({"ack.node.gpu.schedule": "cgpu", DRIVER_LABEL: "dra"}, {DRA_NODE}),
    ({"ack.node.gpu.schedule": "core_mem", DRIVER_LABEL: "dra"}, {DRA_NODE}),
    ({"gpushare": "true", DRIVER_LABEL: "dra"}, {DRA_NODE}),
    ({"cgpu": "true", DRIVER_LABEL: "dra"}, {DRA_NODE}),
    ({"ack.node.gpu.schedule": "cgpu"}, {NODE}),
    ({"ack.node.gpu.schedule": "share", DRIVER_LABEL: "device-plugin"}, {NODE}),
    ({"gpushare": "true"}, {NODE}),
    ({"cgpu": "true"}, {NODE}),
    ({DRIVER_LABEL: "dra"}, set()),  # not a GPU-sharing node
    ({"ack.node.gpu.schedule": "exclusive", DRIVER_LABEL: "dra"}, set()),
    ({}, set()),
]


@pytest.mark.parametrize(("labels", "daemonsets"), NODES, ids=[json.dumps(n) for n, _ in NODES])
def test_a_gpu_node_runs_the_device_plugin_or_the_dra_driver_never_both(on_136, labels, daemonsets):
    assert runs_on(on_136, labels) == daemonsets


def test_without_dra_a_node_labelled_dra_keeps_the_device_plugin():
    """Turning DRA mode off leaves no labelled GPU node without a plugin."""
    assert runs_on(render(), {"ack.node.gpu.schedule": "cgpu", DRIVER_LABEL: "dra"}) == {NODE}


def test_both_daemonsets_place_their_pods_alike_but_for_the_driver_label():
    values = {
        "node": {"nodeSelector": {"pool": "gpu"}, "podAnnotations": {"a": "b"}},
        "gpu": {"runtimeClassName": "nvidia"},
        "imagePullSecrets": [{"name": "registry"}],
    }
    rendered = dra(values)
    node, dra_node = pod_spec(rendered, NODE), pod_spec(rendered, DRA_NODE)
    for key in (
        "priorityClassName",
        "tolerations",
        "nodeSelector",
        "runtimeClassName",
        "imagePullSecrets",
        "hostPID",
        "automountServiceAccountToken",
    ):
        assert dra_node[key] == node[key], key
    assert dra_node["automountServiceAccountToken"] is False
    templates = [rendered.one("DaemonSet", n)["spec"] for n in (NODE, DRA_NODE)]
    assert templates[0]["updateStrategy"] == templates[1]["updateStrategy"]
    assert templates[1]["template"]["metadata"]["annotations"] == {"a": "b"}
    # Distinct selectors: neither DaemonSet adopts the other's pods.
    selectors = [t["selector"]["matchLabels"] for t in templates]
    assert selectors[0] != selectors[1]
    assert selectors[1]["app.kubernetes.io/component"] == "dra-node"
    assert templates[1]["template"]["metadata"]["labels"].items() >= selectors[1].items()


# ----- what the cluster must serve


def refusal(values: dict, kube_version: str, api_versions: tuple[str, ...] = ()) -> str:
    with pytest.raises(helm.HelmRenderError) as refused:
        render(values, kube_version=kube_version, api_versions=api_versions)
    return " ".join(str(refused.value).split())


@pytest.mark.parametrize(
    ("kube_version", "api_versions"),
    [
        ("v1.33.3", ()),  # helm template: Helm's own list has resource.k8s.io/v1 anyway
        ("v1.31.4-eks-1", ()),
        (V135, LIVE_CLUSTER),  # a live cluster whose discovery has no DeviceClass
    ],
)
def test_refused_where_the_cluster_serves_no_resource_k8s_io_v1(kube_version, api_versions):
    message = refusal(WHOLE_GPUS, kube_version, api_versions)
    assert "dra.enabled needs resource.k8s.io/v1" in message
    assert "Kubernetes 1.34 or later" in message
    assert "gate DynamicResourceAllocation" in message
    assert f"Kubernetes {kube_version}" in message
    assert "dra.enabled=false" in message
    assert ("--kube-version" in message) == (not api_versions)


@pytest.mark.parametrize(
    ("kube_version", "api_versions"),
    [(V134, ()), ("v1.34.0-rc.1", ()), (V134, (*LIVE_CLUSTER, DEVICE_CLASS_KIND))],
)
def test_accepted_where_the_cluster_serves_it(kube_version, api_versions):
    rendered = render(WHOLE_GPUS, kube_version=kube_version, api_versions=api_versions)
    assert rendered.one("DaemonSet", DRA_NODE)


@pytest.mark.parametrize("kube_version", [V134, "v1.35.9", "v1.35.2-gke.1000"])
def test_sharing_below_1_36_without_the_gate_value_is_refused_naming_the_gate(kube_version):
    message = refusal(DRA, kube_version)
    assert "DRAConsumableCapacity" in message
    assert "dra.sharing=false" in message
    assert "dra.consumableCapacityGate=true" in message
    assert f"Kubernetes {kube_version}" in message


@pytest.mark.parametrize(
    ("values", "kube_version"),
    [(WITH_GATE, V134), (WITH_GATE, V135), (WHOLE_GPUS, V135), (DRA, V136), (DRA, "v1.36.0-rc.0")],
)
def test_sharing_is_accepted_with_the_gate_value_from_1_36_or_whole_gpus(values, kube_version):
    assert render(values, kube_version=kube_version).one("DaemonSet", DRA_NODE)


def feature_gates(rendered: Rendered) -> list[str]:
    spec = rendered.one("Deployment", SCHEDULER)["spec"]["template"]["spec"]
    return [a for a in container(spec, "kube-scheduler")["command"] if "feature-gates" in a]


@pytest.mark.parametrize(
    ("values", "kube_version", "gates"),
    [
        (WITH_GATE, V135, ["--feature-gates=DRAConsumableCapacity=true"]),
        (WITH_GATE, V134, ["--feature-gates=DRAConsumableCapacity=true"]),
        (WITH_GATE, V136, []),  # beta and on
        (merged(WITH_GATE, WHOLE_GPUS), V135, []),  # nothing to share
        ({"dra": {"consumableCapacityGate": True}}, V135, []),  # no DRA mode
    ],
)
def test_our_kube_scheduler_gets_the_gate_where_it_is_off_by_default(values, kube_version, gates):
    assert feature_gates(render(values, kube_version=kube_version)) == gates


# ----- the driver container


def expected_flags(**changed: str) -> dict[str, str]:
    base = {
        "--node-name": "$(NODE_NAME)",
        "--backend": "nvml",
        "--gpu-memory-rounding": "up",
        "--log-level": "info",
        "--kubelet-root": "/var/lib/kubelet",
        "--cdi-dir": "/var/run/cdi",
        "--state-dir": "/var/lib/gpushare/dra",
        "--sharing": "on",
        "--metrics-port": "9403",
        "--dev-root": "/host/dev",
        "--interposer-dir": "/var/lib/gpushare/interposer",
    }
    return {k: v for k, v in (base | changed).items() if v is not None}


def test_the_driver_runs_the_dra_plugin_with_the_designs_flags(on_136):
    c = driver(on_136)
    assert c["command"] == ["gpushare-dra-plugin"]
    assert flags(c) == expected_flags()
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert {"name": "dra-metrics", "containerPort": 9403, "protocol": "TCP"} in c["ports"]


@pytest.mark.parametrize(
    ("values", "kube_version", "changed"),
    [
        (WHOLE_GPUS, V136, {"--sharing": "off"}),
        (WHOLE_GPUS, V134, {"--sharing": "off"}),
        (WITH_GATE, V135, {}),
        ({"node": {"kubeletDir": "/var/lib/k0s/kubelet/"}}, V136,
         {"--kubelet-root": "/var/lib/k0s/kubelet"}),
        ({"dra": {"cdiDir": "/etc/cdi", "stateDir": "/opt/dra", "metricsPort": 9500}}, V136,
         {"--cdi-dir": "/etc/cdi", "--state-dir": "/opt/dra", "--metrics-port": "9500"}),
        ({"gpu": {"backend": "mock", "mockGpus": "1x24GiB:A10"}}, V136,
         {"--backend": "mock", "--mock-gpus": "1x24GiB:A10", "--gpu-memory-rounding": None,
          "--dev-root": None}),
        ({"gpu": {"memoryRounding": "down"}, "logLevel": "debug"}, V136,
         {"--gpu-memory-rounding": "down", "--log-level": "debug"}),
        ({"isolation": {"interposer": {"enabled": False}}}, V136, {"--interposer-dir": ""}),
        ({"isolation": {"interposer": {"dir": "/opt/interposer"}}}, V136,
         {"--interposer-dir": "/opt/interposer"}),
        ({"dra": {"extraArgs": ["--kubeconfig=/etc/kube.conf"]}}, V136,
         {"--kubeconfig": "/etc/kube.conf"}),
    ],
)  # fmt: skip
def test_the_driver_flags_follow_the_values(values, kube_version, changed):
    assert flags(driver(dra(values, kube_version))) == expected_flags(**changed)


def test_the_driver_reads_the_gpus_as_the_device_plugin_does():
    """Same backend flags and environment: one node's GPUs are the same in both modes."""
    for values in ({}, {"gpu": {"backend": "mock"}}, {"gpu": {"driverRoot": "/run/nvidia/driver"}}):
        rendered = dra(values)
        plugin = container(pod_spec(rendered, NODE), "device-plugin")
        shared = ("--node-name", "--backend", "--mock-gpus", "--gpu-memory-rounding", "--dev-root")
        for flag in shared:
            assert flags(driver(rendered)).get(flag) == flags(plugin).get(flag), (values, flag)
        assert driver(rendered)["env"] == plugin["env"], values
        assert driver(rendered)["securityContext"] == plugin["securityContext"], values


def mounts(spec: dict, c: dict) -> dict[str, tuple[str | None, bool]]:
    """mountPath -> (the host path behind it or None, read-only)."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    return {
        m["mountPath"]: (
            volumes[m["name"]].get("hostPath", {}).get("path"),
            m.get("readOnly", False),
        )
        for m in c["volumeMounts"]
    }


@pytest.mark.parametrize("kubelet", ["/var/lib/kubelet", "/var/lib/k0s/kubelet"])
def test_the_driver_mounts_the_kubelet_cdi_and_state_dirs_at_the_nodes_own_paths(kubelet):
    """The kubelet dials the socket path the driver registers, and the runtime reads
    the CDI spec where the driver wrote it (DRA-INTERFACES §1, §3)."""
    rendered = dra({"node": {"kubeletDir": kubelet}})
    spec = pod_spec(rendered, DRA_NODE)
    found = mounts(spec, driver(rendered))
    registry, plugins = f"{kubelet}/plugins_registry", f"{kubelet}/plugins/{DRIVER}"
    device_plugins = f"{kubelet}/device-plugins"  # only to see the device plugin's socket
    assert found == {
        registry: (registry, False),
        plugins: (plugins, False),
        device_plugins: (device_plugins, True),
        "/var/run/cdi": ("/var/run/cdi", False),
        "/var/lib/gpushare/dra": ("/var/lib/gpushare/dra", False),
        "/var/lib/gpushare/interposer": ("/var/lib/gpushare/interposer", False),
        "/host/dev": ("/dev", True),
        "/tmp": (None, False),
        "/var/run/secrets/kubernetes.io/serviceaccount": (None, True),
    }
    host_dev = next(m for m in driver(rendered)["volumeMounts"] if m["mountPath"] == "/host/dev")
    assert host_dev["recursiveReadOnly"] == "IfPossible"
    volumes = {v["name"]: v for v in spec["volumes"]}
    for name in ("plugins-registry", "plugin-dir", "cdi", "state"):
        assert volumes[name]["hostPath"]["type"] == "DirectoryOrCreate", name


def test_with_mock_gpus_the_driver_gets_no_dev_and_with_a_driver_root_it_does():
    mock = dra({"gpu": {"backend": "mock"}})
    assert "/host/dev" not in mounts(pod_spec(mock, DRA_NODE), driver(mock))
    rooted = dra({"gpu": {"driverRoot": "/run/nvidia/driver"}})
    found = mounts(pod_spec(rooted, DRA_NODE), driver(rooted))
    assert found["/driver-root"] == ("/run/nvidia/driver", True)
    assert driver(rooted)["securityContext"]["privileged"] is True


def test_the_driver_alone_holds_the_pods_api_token(on_136):
    spec = pod_spec(on_136, DRA_NODE)
    assert spec["serviceAccountName"] == DRA_ACCOUNT
    with_token = [
        c["name"]
        for c in spec["containers"]
        if any(m["name"] == "kube-api-access" for m in c["volumeMounts"])
    ]
    assert with_token == ["dra-plugin"]
    c = driver(on_136)
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["resources"]["limits"]["memory"] == "256Mi"


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"isolation": {"privileged": False, "hostPID": False}},
        {"gpu": {"driverRoot": "/run/nvidia/driver"}},
        {"gpu": {"backend": "mock"}},
        {"isolation": {"interposer": {"enabled": False}, "memoryAction": "report"}},
    ],
    ids=["defaults", "unprivileged", "driver-root", "mock", "no-interposer"],
)
def test_the_agent_runs_beside_the_driver_exactly_as_beside_the_device_plugin(values):
    """The agent enforces the caps in both modes (same container, same host paths)."""
    rendered = dra(values)
    node, dra_node = pod_spec(rendered, NODE), pod_spec(rendered, DRA_NODE)
    assert [c["name"] for c in dra_node["containers"]] == ["dra-plugin", "isolation"]
    agent = container(node, "isolation")
    assert container(dra_node, "isolation") == agent
    assert mounts(dra_node, agent) == mounts(node, agent)


def test_without_the_agent_the_dra_pod_runs_the_driver_alone():
    rendered = dra({"isolation": {"enabled": False}})
    spec = pod_spec(rendered, DRA_NODE)
    assert [c["name"] for c in spec["containers"]] == ["dra-plugin"]
    assert "hostPID" not in spec
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert not paths & {"/proc", "/sys/fs/cgroup", "/var/lib/gpushare/interposer"}
    assert flags(driver(rendered))["--interposer-dir"] == ""


# ----- metrics


def test_the_dra_pods_metrics_are_served_and_scraped_when_asked():
    rendered = dra({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"r": "p"}}}})
    service = rendered.one("Service", f"{DRA_NODE}-metrics")
    selector = rendered.one("DaemonSet", DRA_NODE)["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    assert service["spec"]["clusterIP"] == "None"
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {"dra-metrics": (9403, "dra-metrics"), "agent-metrics": (9402, "agent-metrics")}
    served = {
        port["name"]: port["containerPort"]
        for c in pod_spec(rendered, DRA_NODE)["containers"]
        for port in c.get("ports", [])
    }
    assert served == {name: number for name, (number, _) in ports.items()}
    monitor = rendered.one("ServiceMonitor", DRA_NODE)
    assert monitor["spec"]["selector"]["matchLabels"] == selector
    assert monitor["metadata"]["labels"]["r"] == "p"
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["dra-metrics", "agent-metrics"]


def test_metrics_turned_off_leave_no_port_and_no_monitor_by_default():
    rendered = dra({"dra": {"metricsPort": 0}})
    assert "ports" not in driver(rendered)
    service = rendered.one("Service", f"{DRA_NODE}-metrics")
    assert [p["name"] for p in service["spec"]["ports"]] == ["agent-metrics"]
    assert [m["metadata"]["name"] for m in rendered.all("ServiceMonitor")] == []
    off = dra({"dra": {"metricsPort": 0}, "isolation": {"enabled": False}})
    assert [s for s in off.all("Service") if s["metadata"]["name"] == f"{DRA_NODE}-metrics"] == []


# ----- RBAC (DRA-INTERFACES §8)


def grants(rules: list[dict]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """(group, resource, verb, resourceNames) for each rule's every combination."""
    return {
        (group, resource, verb, tuple(rule.get("resourceNames", ())))
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def rules_bound_to(rendered: Rendered, account: str) -> dict[str, list[dict]]:
    """Role name -> rules, of every role the chart binds to the account."""
    roles = {(r["kind"], r["metadata"]["name"]): r for r in rendered.objects if "rules" in r}
    bound = {}
    for binding in [*rendered.all("ClusterRoleBinding"), *rendered.all("RoleBinding")]:
        if any(s["name"] == account for s in binding["subjects"]):
            ref = binding["roleRef"]
            role = roles.get((ref["kind"], ref["name"]), {"rules": []})  # built-in: none
            bound[ref["name"]] = role["rules"]
    return bound


def both(group: str, resource: str, *verbs: str, names: tuple[str, ...] = ()) -> set:
    return {(group, resource, verb, names) for verb in verbs}


R = "resource.k8s.io"


@pytest.mark.parametrize(("values", "kube_version"), [(WHOLE_GPUS, V134), (WITH_GATE, V135)])
def test_the_driver_account_holds_one_role_alike_on_every_version(values, kube_version, on_136):
    """Its rules are its code's calls (test_rbac.py); none depends on the version."""
    rendered = render(values, kube_version=kube_version)
    assert list(rules_bound_to(rendered, DRA_ACCOUNT)) == [DRA_ACCOUNT]
    rules = rules_bound_to(rendered, DRA_ACCOUNT)[DRA_ACCOUNT]
    assert rules == rules_bound_to(on_136, DRA_ACCOUNT)[DRA_ACCOUNT]
    assert all("*" not in r["verbs"] + r["resources"] + r["apiGroups"] for r in rules)
    account = rendered.one("ServiceAccount", DRA_ACCOUNT)
    assert account["automountServiceAccountToken"] is False
    assert account["metadata"]["namespace"] == NAMESPACE


def test_the_driver_may_write_slices_claims_nodes_and_pods_but_never_bind_or_read_secrets(on_136):
    held = grants(rules_bound_to(on_136, DRA_ACCOUNT)[DRA_ACCOUNT])
    verbs = {(g, r, v) for g, r, v, _ in held}
    assert {(R, "resourceslices", "create"), (R, "resourceclaims", "get")} <= verbs
    for forbidden in [
        ("", "pods/binding", "create"),
        ("", "pods", "delete"),
        ("", "pods", "create"),
        ("", "secrets", "get"),
        (R, "resourceclaims", "update"),
        (R, "resourceclaims/binding", "update"),
        (R, "deviceclasses", "create"),
    ]:
        assert forbidden not in verbs, forbidden


def test_without_rbac_create_the_driver_account_comes_without_roles():
    rendered = dra({"rbac": {"create": False}})
    assert rendered.one("ServiceAccount", DRA_ACCOUNT)
    assert rules_bound_to(rendered, DRA_ACCOUNT) == {}


SCHEDULER_DRA_RULES = (
    both(R, "resourceclaims", "get", "list", "watch", "update", "patch")
    | both(R, "resourceclaims/status", "update", "patch")
    | both(R, "resourceslices", "get", "list", "watch")
    | both(R, "deviceclasses", "get", "list", "watch")
    | both(R, "resourceclaimtemplates", "get", "list", "watch")
)


@pytest.mark.parametrize(
    ("values", "kube_version", "wanted"),
    [
        (WITH_GATE, V135, SCHEDULER_DRA_RULES),
        (DRA, V136, SCHEDULER_DRA_RULES | both(R, "resourceclaims/binding", "update", "patch")),
    ],
)
def test_our_kube_scheduler_may_allocate_claims(values, kube_version, wanted):
    """Its DynamicResources plugin allocates the claims of the pods sent to it; from
    1.36 writing the allocation takes resourceclaims/binding (DRA-INTERFACES §8)."""
    bound = rules_bound_to(render(values, kube_version=kube_version), SCHEDULER)
    assert grants(bound[f"{SCHEDULER}-dra"]) == wanted


def extender_rules(rendered: Rendered) -> set:
    return grants(rendered.one("ClusterRole", f"{SCHEDULER}-extender")["rules"])


@pytest.mark.parametrize(
    ("values", "added"),
    [
        (DRA, both(R, "resourceclaimtemplates", "create")),
        ({"dra": {"convertAckPods": False}}, set()),
        ({"webhook": {"enabled": False}}, set()),  # the webhook makes the claims
    ],
    ids=["convert", "no-conversion", "no-webhook"],
)
def test_the_extender_may_make_claim_templates_only_where_its_webhook_converts_pods(values, added):
    """The rule itself is the code's call (test_rbac.py); here: when the chart grants it."""
    without = extender_rules(render({"webhook": values.get("webhook", {})}))
    assert extender_rules(dra(values)) - without == added
    assert without - extender_rules(dra(values)) == set()


def test_no_dra_rule_or_account_without_dra_mode():
    rendered = render(kube_version=V136)
    every_rule = [r for role in rendered.all("ClusterRole") for r in role["rules"]]
    assert [r for r in every_rule if R in r["apiGroups"]] == []
    accounts = {a["metadata"]["name"] for a in rendered.all("ServiceAccount")}
    assert DRA_ACCOUNT not in accounts


def test_every_dra_binding_names_an_account_the_chart_creates(on_136):
    accounts = {a["metadata"]["name"] for a in on_136.all("ServiceAccount")}
    for binding in on_136.all("ClusterRoleBinding"):
        for subject in binding["subjects"]:
            assert subject["name"] in accounts and subject["namespace"] == NAMESPACE
    pods = [*on_136.all("DaemonSet"), on_136.one("Deployment"), on_136.one("Job")]
    assert {p["spec"]["template"]["spec"]["serviceAccountName"] for p in pods} == accounts


# ----- the driver's slices stay its own node's (ValidatingAdmissionPolicy)


def policy_objects(rendered: Rendered) -> list[dict]:
    return [
        o
        for o in rendered.objects
        if o["kind"].startswith("ValidatingAdmissionPolicy") and o["metadata"]["name"] == POLICY
    ]


def test_the_policy_is_rendered_with_its_binding_in_dra_mode(on_136):
    policy, binding = policy_objects(on_136)
    assert (policy["kind"], binding["kind"]) == (
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    )
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}


def test_the_policy_is_off_by_its_value_or_without_dra_and_on_when_the_value_is_unset():
    assert policy_objects(dra({"dra": {"ownNodePolicy": False}})) == []
    assert policy_objects(render(kube_version=V136)) == []
    # --reuse-values from a release before the value: absent, not false.
    assert len(policy_objects(dra({"dra": {"ownNodePolicy": None}}))) == 2


def test_the_policy_covers_every_write_of_the_drivers_account_and_fails_closed():
    rendered = dra(release="other", namespace="gpu")
    [policy, _] = [
        o for o in rendered.objects if o["kind"].startswith("ValidatingAdmissionPolicy")
        if "dra-plugin" in o["metadata"]["name"]
    ]  # fmt: skip
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [R],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["resourceslices"],
        },
        {
            "apiGroups": [""],
            "apiVersions": ["*"],
            "operations": ["UPDATE", "DELETE"],
            "resources": ["nodes", "nodes/*", "pods", "pods/*"],
        },
    ]
    account = pod_spec(rendered, "other-gpushare-dra-node")["serviceAccountName"]
    [condition] = spec["matchConditions"]
    assert condition["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:gpu:{account}"'
    )


def test_the_policy_covers_what_the_drivers_rules_let_it_write(on_136):
    """Every resource the account may change is one the policy confines."""
    [policy, _] = policy_objects(on_136)
    covered = {
        (group, resource)
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    written = {
        (g, r) for g, r, v, _ in grants(rules_bound_to(on_136, DRA_ACCOUNT)[DRA_ACCOUNT])
        if v in writes
    }  # fmt: skip
    assert written and written <= covered


def test_the_node_is_the_tokens_and_each_object_touched_must_be_of_it(on_136):
    [policy, _] = policy_objects(on_136)
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert f"request.userInfo.extra['{NODE_KEY}'][0]" in variables["node"]
    assert f"'{NODE_KEY}' in request.userInfo.extra" in variables["node"]
    # The slice's node before the request (not on CREATE) and after it (not on DELETE).
    nodes = " ".join(variables["sliceNodes"].split())
    assert "request.operation == 'CREATE' ? [] : [has(oldObject.spec.nodeName)" in nodes
    assert "request.operation == 'DELETE' ? [] : [has(object.spec.nodeName)" in nodes
    token, own_node, own_pods, own_slices = policy["spec"]["validations"]
    assert token["expression"] == "variables.node != ''"
    assert token["message"].startswith("the DRA driver's token names no node")
    assert "oldObject.metadata.name == variables.node" in own_node["expression"]
    assert "oldObject.spec.nodeName == variables.node" in own_pods["expression"]
    assert " ".join(own_slices["expression"].split()) == (
        "variables.node == '' || request.resource.resource != 'resourceslices'"
        " || variables.sliceNodes.all(n, n == variables.node)"
    )
    for validation in (own_node, own_pods, own_slices):
        assert flat(validation["messageExpression"]).startswith("'the DRA driver of node '")
    assert "may write only the ResourceSlices of its own node" in flat(
        own_slices["messageExpression"]
    )
    assert {v["reason"] for v in policy["spec"]["validations"]} == {"Forbidden"}


def test_the_node_and_pod_checks_are_the_device_plugins(on_136):
    """One check for both plugins: only the component the messages name differs."""
    [ours, _] = policy_objects(on_136)
    theirs = on_136.one("ValidatingAdmissionPolicy", f"{FULLNAME}-device-plugin-own-node")
    assert ours["spec"]["variables"][0] == theirs["spec"]["variables"][0]
    mine = json.dumps(ours["spec"]["validations"][:3]).replace("DRA driver", "device plugin")
    assert json.loads(mine) == theirs["spec"]["validations"]


# ----- the extender and the uninstall hook


def extender_flags(rendered: Rendered) -> dict[str, str]:
    spec = rendered.one("Deployment", SCHEDULER)["spec"]["template"]["spec"]
    return flags(container(spec, "extender"))


@pytest.mark.parametrize(
    ("values", "converts"),
    [
        (DRA, True),
        (merged(DRA, {"dra": {"convertAckPods": False}}), False),
        (merged(DRA, {"webhook": {"enabled": False}}), False),
        ({"dra": {"convertAckPods": True}}, False),  # no DRA mode
    ],
)
def test_the_extender_converts_ack_pods_into_claims_only_in_dra_mode_when_asked(values, converts):
    assert ("--dra-claims" in extender_flags(render(values, kube_version=V136))) == converts


def hook_args(rendered: Rendered) -> list[str]:
    spec = rendered.one("Job", HOOK)["spec"]["template"]["spec"]
    return container(spec, "uninstall-cleanup")["args"]


def test_the_uninstall_hook_deletes_the_drivers_slices_in_dra_mode_only(on_136):
    """The kubelet wipes a driver's slices 30 s after it goes (DRA-INTERFACES §3), but
    only where a kubelet runs to do it."""
    assert f"--resource-slice-driver={DRIVER}" in hook_args(on_136)
    assert grants(on_136.one("ClusterRole", HOOK)["rules"]) == both(
        "", "nodes", "get", "list", "patch"
    ) | both(R, "resourceslices", "list", "delete")
    default = render(kube_version=V136)
    assert not [a for a in hook_args(default) if "resource-slice" in a]
    assert grants(default.one("ClusterRole", HOOK)["rules"]) == both(
        "", "nodes", "get", "list", "patch"
    )


# ----- nothing of DRA mode without it


CERTIFICATES = ("ca.crt", "tls.crt", "tls.key", "caBundle")
"""The webhook's certificates, generated anew by each render."""
_BLOB = re.compile(rf"({'|'.join(map(re.escape, CERTIFICATES))}): \S+")


def _masked(rendered: Rendered) -> dict[str, str]:
    return {path: _BLOB.sub(r"\1: X", text) for path, text in rendered.manifests.items()}


def _masked_objects(value: Any) -> Any:
    """The objects, each certificate replaced by X."""
    if isinstance(value, dict):
        return {k: "X" if k in CERTIFICATES else _masked_objects(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked_objects(v) for v in value]
    return value


@pytest.mark.parametrize(
    "values", [{"dra": {"enabled": False}}, {"dra": None}, {"dra": {"sharing": False}}]
)
@pytest.mark.parametrize("kube_version", ["v1.29.9", V134, V136])
def test_without_dra_mode_the_chart_renders_byte_for_byte_as_without_the_section(
    values, kube_version
):
    """dra off, or absent (--reuse-values from a release before it), is the chart as it
    was before DRA mode: every template's text, NOTES included."""
    baseline = render({"dra": {"enabled": False}}, kube_version=kube_version)
    assert _masked(render(values, kube_version=kube_version)) == _masked(baseline)


DRA_ADDITIONS = {
    "args": ("--dra-claims", f"--resource-slice-driver={DRIVER}"),
    "roles": (f"{SCHEDULER}-dra",),
}


SCHEDULER_CONFIG_MAP = f"{FULLNAME}-scheduler-config"


def _config_read(objects: list[dict]) -> list[dict]:
    """The objects, the scheduler's configuration read from its text (to compare it
    entry by entry)."""
    for obj in objects:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == SCHEDULER_CONFIG_MAP:
            obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
        template = obj.get("spec", {}).get("template", {}).get("metadata", {})
        if "checksum/config" in template.get("annotations", {}):
            template["annotations"]["checksum/config"] = "X"  # of the text compared above
    return objects


def without_dra(rendered: Rendered) -> list[dict]:
    """The objects, less exactly what DRA mode adds (at 1.36: no feature gate flag)."""
    kept = []
    for obj in _config_read(_masked_objects(rendered.objects)):
        if obj["metadata"]["name"] == SCHEDULER_CONFIG_MAP:
            config = obj["data"]["scheduler-config.yaml"]
            config["extenders"] = [
                e for e in config["extenders"] if e.get("prioritizeVerb") != Verb.PRIORITIZE_CLAIMS
            ]
        labels = obj["metadata"].get("labels", {})
        if labels.get("app.kubernetes.io/component") == "dra-node":
            continue
        if obj["metadata"]["name"] in DRA_ADDITIONS["roles"]:
            continue
        if "rules" in obj:
            obj["rules"] = [r for r in obj["rules"] if R not in r["apiGroups"]]
        spec = obj.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []):
            if "args" in c:
                c["args"] = [a for a in c["args"] if a not in DRA_ADDITIONS["args"]]
        affinity = spec.get("affinity", {}).get("nodeAffinity", {})
        for term in affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get(
            "nodeSelectorTerms", []
        ):
            term["matchExpressions"] = [
                e for e in term["matchExpressions"] if e["key"] != DRIVER_LABEL
            ]
        kept.append(obj)
    return kept


MOCK_WITHOUT_AGENT = {"gpu": {"backend": "mock"}, "isolation": {"enabled": False}}


@pytest.mark.parametrize("values", [{}, MOCK_WITHOUT_AGENT], ids=["nvml", "mock-without-agent"])
def test_dra_mode_adds_its_objects_and_changes_nothing_else(values):
    off = _config_read(_masked_objects(render(values, kube_version=V136).objects))
    assert without_dra(dra(values)) == off


# ----- notes and values


def test_the_notes_say_how_to_label_a_dra_node_and_which_device_class(on_136):
    notes = flat(on_136.notes)
    assert "kubectl label node <NODE> ack.node.gpu.schedule=cgpu gpushare.io/driver=dra" in notes
    assert f"DeviceClass {DRIVER}" in notes
    assert f"kubectl get resourceslices --field-selector spec.driver={DRIVER}" in notes
    assert "Drain a node before switching it between the modes" in notes
    assert "on by default from Kubernetes 1.36" in notes
    assert "gpushare.io/driver" not in render(kube_version=V136).notes


def test_the_notes_say_what_the_gate_value_asserts_below_1_36_and_about_whole_gpus():
    gated = flat(render(WITH_GATE, kube_version=V135).notes)
    assert f"DRAConsumableCapacity (alpha, off by default in Kubernetes {V135})" in gated
    assert "must be on in kube-apiserver and in every kube-scheduler" in gated
    assert "this chart's scheduler runs with it on" in gated
    whole = flat(render(WHOLE_GPUS, kube_version=V134).notes)
    assert "dra.sharing=false: each claim gets whole GPUs" in whole
    assert "DRAConsumableCapacity" not in whole


def test_the_notes_say_the_webhook_converts_pods_only_where_it_does(on_136):
    said = f"a ResourceClaim of {DRIVER} instead"
    assert said in flat(on_136.notes)
    assert said not in flat(dra({"dra": {"convertAckPods": False}}).notes)


@pytest.mark.parametrize(
    "values",
    [
        {"dra": {"enable": True}},
        {"dra": {"enabled": "true"}},
        {"dra": {"sharing": "on"}},
        {"dra": {"consumableCapacityGate": "yes"}},
        {"dra": {"metricsPort": 70000}},
        {"dra": {"cdiDir": 1}},
        {"dra": {"extraArgs": "--x"}},
        {"dra": {"convertAckPods": 1}},
        {"dra": {"ownNodePolicy": "false"}},
        {"dra": True},
    ],
    ids=lambda v: json.dumps(v),
)
def test_the_schema_refuses_dra_typos_and_bad_types(values):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)


def test_the_dra_defaults_are_the_designs():
    with helm.Chart.load(CHART) as chart:
        assert chart.values["dra"] == {
            "enabled": False,
            "sharing": True,
            "consumableCapacityGate": False,
            "metricsPort": 9403,
            "cdiDir": "/var/run/cdi",
            "stateDir": "/var/lib/gpushare/dra",
            "ownNodePolicy": True,
            "convertAckPods": True,
            "resources": {
                "requests": {"cpu": "50m", "memory": "64Mi"},
                "limits": {"memory": "256Mi"},
            },
            "extraArgs": [],
        }


def test_each_dra_value_has_a_comment():
    text = (CHART / "values.yaml").read_text()
    section = text.split("\ndra:\n", 1)[1].split("\n\n", 1)[0]
    lines = section.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^  [a-zA-Z]+:", line):
            assert lines[i - 1].lstrip().startswith("#"), line


# ----- the entry points the chart starts (their flags: test_chart.py's CONTRACT_FLAGS)


def test_the_extender_reads_the_charts_dra_claims_flag(on_136):
    from gpushare.extender.main import build_parser

    spec = on_136.one("Deployment", SCHEDULER)["spec"]["template"]["spec"]
    assert build_parser().parse_args(container(spec, "extender")["args"]).dra_claims is True


def test_the_cleanup_command_reads_the_hooks_slice_flag(on_136):
    from gpushare.cli.main import build_parser

    spec = on_136.one("Job", HOOK)["spec"]["template"]["spec"]
    c = container(spec, "uninstall-cleanup")
    args = build_parser().parse_args(c["command"][1:] + c["args"])
    assert args.resource_slice_driver == [DRIVER]


# ----- our node scores for pods rewritten to a claim


def test_a_second_extender_entry_scores_the_pods_rewritten_to_a_claim(on_136):
    first, second = scheduler_config(on_136)["extenders"]
    assert first["managedResources"] and first["bindVerb"] == "bind"
    # No managedResources: kube-scheduler asks it about every pod of our scheduler,
    # including those that ask no aliyun.com resource any more.
    assert set(second) <= EXTENDER_KEYS
    assert "managedResources" not in second
    assert not any(second.get(verb) for verb in ("filterVerb", "bindVerb", "preemptVerb"))
    assert second["prioritizeVerb"] == Verb.PRIORITIZE_CLAIMS
    assert second["urlPrefix"] == first["urlPrefix"] and second["weight"] == first["weight"]
    assert second["nodeCacheCapable"] is True and second["ignorable"] is True


@pytest.mark.parametrize(
    "values",
    [
        {},
        merged(DRA, {"dra": {"convertAckPods": False}}),
        merged(DRA, {"webhook": {"enabled": False}}),
    ],
    ids=["device-plugin-mode", "pods-not-converted", "no-webhook"],
)
def test_without_rewritten_pods_there_is_one_extender_entry(values):
    assert len(scheduler_config(render(values, kube_version=V136))["extenders"]) == 1
