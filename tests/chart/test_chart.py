"""The Helm chart, linted and rendered by Helm's own engine, checked object by object."""

import argparse
import base64
import importlib.util
import json
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python as helm
import pytest
import yaml

from gpushare.resources import MANAGED_RESOURCES
from tests.chart.rendering import (
    CHART,
    CUSTOM_KINDS,
    FULLNAME,
    NAMESPACE,
    container,
    dropped_fields,
    flags,
    render,
    render_chart,
    scheduler_config,
    webhook_configurations,
)
from tests.prometheus import ALERTS

RUNBOOKS = "https://github.com/gpushare/gpushare/blob/main/docs/troubleshooting.md"

VALUE_SETS = {
    "defaults": {},
    "mock-backend": {"gpu": {"backend": "mock", "mockGpus": "2x16GiB,1x80GiB:A100"}},
    "cert-manager": {"webhook": {"certManager": {"enabled": True}}},
    "cert-manager-own-issuer": {
        "webhook": {
            "certManager": {"enabled": True, "issuerRef": {"name": "ca", "kind": "ClusterIssuer"}}
        }
    },
    "service-monitor": {
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}
    },
    "prometheus-rule": {
        "metrics": {
            "prometheusRule": {
                "enabled": True,
                "labels": {"release": "prom"},
                "additionalLabels": {"team": "gpu"},
            }
        }
    },
    "failure-ignore": {"webhook": {"failurePolicy": "Ignore", "matchConditions": False}},
    "fail-without-match-conditions": {
        "webhook": {"failurePolicy": "Fail", "matchConditions": False}
    },
    "opt-in-selectors": {
        "webhook": {
            "failurePolicy": "Fail",
            "matchConditions": False,
            "objectSelector": {"matchLabels": {"gpushare.io/webhook": "true"}},
            "namespaceSelector": {"matchLabels": {"gpushare.io/gpu-workloads": "true"}},
        }
    },
    "unprivileged-agent": {"isolation": {"privileged": False, "hostPID": False}},
    "network-policy": {"networkPolicy": {"enabled": True, "apiServerCidrs": ["10.0.0.0/24"]}},
    "runtime-class": {"gpu": {"runtimeClassName": "nvidia"}},
    "driver-root": {"gpu": {"driverRoot": "/run/nvidia/driver"}},
    "dra": {"dra": {"enabled": True}},
    "dra-mock-whole-gpus": {
        "dra": {"enabled": True, "sharing": False},
        "gpu": {"backend": "mock", "mockGpus": "1x24GiB:A10"},
    },
    "minimal": {
        "isolation": {"enabled": False},
        "webhook": {"enabled": False},
        "devicePlugin": {"metricsPort": 0},
        "metrics": {"grafanaDashboard": {"enabled": False}},
        "scheduler": {"replicas": 1, "leaderElection": {"enabled": False}},
    },
}


@pytest.fixture(scope="module")
def default() -> "object":
    return render()


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint_is_clean(values):
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_object_loads_into_the_kubernetes_api_models(values):
    rendered = render(values)
    assert rendered.objects
    for obj in rendered.objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            assert obj["metadata"]["namespace"] == NAMESPACE, where
            assert isinstance(obj.get("spec"), dict), where
            continue
        assert dropped_fields(obj) == [], f"{where} has fields the API does not know"


# ----- the node DaemonSet


def test_daemonset_runs_the_plugin_and_the_agent_on_gpu_sharing_nodes(default):
    ds = default.one("DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["device-plugin", "isolation"]
    assert spec["priorityClassName"] == "system-node-critical"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    # One term per label: Kubernetes ORs the terms, ANDs the expressions inside one.
    assert [t["matchExpressions"] for t in terms] == [
        [
            {
                "key": "ack.node.gpu.schedule",
                "operator": "In",
                "values": ["share", "cgpu", "core_mem"],
            }
        ],
        [{"key": "gpushare", "operator": "In", "values": ["true"]}],
        [{"key": "cgpu", "operator": "In", "values": ["true"]}],
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]


def test_device_plugin_gets_the_contract_flags_and_the_kubelet_directories(default):
    spec = default.one("DaemonSet")["spec"]["template"]["spec"]
    plugin = container(spec, "device-plugin")
    assert plugin["command"] == ["gpushare-device-plugin"]
    assert flags(plugin) == {
        "--node-name": "$(NODE_NAME)",
        "--backend": "nvml",
        "--gpu-memory-rounding": "up",
        "--log-level": "info",
        "--device-plugin-dir": "/var/lib/kubelet/device-plugins",
        "--pod-resources-socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
        "--metrics-port": "9401",
        "--dev-root": "/host/dev",
        "--interposer-dir": "/var/lib/gpushare/interposer",
    }
    env = {e["name"]: e for e in plugin["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    mounts = {m["mountPath"]: m["name"] for m in plugin["volumeMounts"]}
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert host[mounts["/var/lib/kubelet/device-plugins"]] == "/var/lib/kubelet/device-plugins"
    assert host[mounts["/var/lib/kubelet/pod-resources"]] == "/var/lib/kubelet/pod-resources"
    security = plugin["securityContext"]
    assert security["runAsUser"] == 0 and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]} and "privileged" not in security
    assert {"name": "plugin-metrics", "containerPort": 9401, "protocol": "TCP"} in plugin["ports"]


def test_isolation_agent_sees_host_proc_cgroups_and_the_control_tree_but_no_api(default):
    spec = default.one("DaemonSet")["spec"]["template"]["spec"]
    agent = container(spec, "isolation")
    assert agent["command"] == ["gpushare-isolation"]
    assert flags(agent) == {
        "--node-name": "$(NODE_NAME)",
        "--backend": "nvml",
        "--gpu-memory-rounding": "up",
        "--log-level": "info",
        "--control-dir": "/run/gpushare/cgpu",
        "--proc-root": "/host/proc",
        "--cgroup-root": "/host/sys/fs/cgroup",
        "--metrics-port": "9402",
        "--memory-action": "kill",
        "--backstop-slack-per-process-mib": "512",
        "--backstop-slack-max-mib": "2048",
        "--interposer-dir": "/var/lib/gpushare/interposer",
    }
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    assert host[mounts["/host/proc"]["name"]] == "/proc" and mounts["/host/proc"]["readOnly"]
    assert host[mounts["/host/sys/fs/cgroup"]["name"]] == "/sys/fs/cgroup"
    assert host[mounts["/run/gpushare/cgpu"]["name"]] == "/run/gpushare/cgpu"
    assert agent["securityContext"]["privileged"] is True and spec["hostPID"] is True
    # No token anywhere in the pod but the plugin's own projected one.
    assert spec["automountServiceAccountToken"] is False
    token_mount = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert token_mount not in mounts
    assert token_mount in {m["mountPath"] for m in container(spec, "device-plugin")["volumeMounts"]}


@pytest.mark.parametrize(
    "values",
    [{}, {"isolation": {"interposer": {"dir": "/opt/gpushare/interposer"}}}],
    ids=["default-dir", "own-dir"],
)
def test_both_node_containers_see_the_interposer_directory_at_the_nodes_own_path(values):
    """Allocate's mounts name host paths: the plugin must see the directory where the
    node has it, and so must the agent that installs the library into it."""
    spec = render(values).one("DaemonSet")["spec"]["template"]["spec"]
    directory = (
        values.get("isolation", {}).get("interposer", {}).get("dir", "/var/lib/gpushare/interposer")
    )
    [volume] = [v for v in spec["volumes"] if v["name"] == "interposer"]
    assert volume["hostPath"] == {"path": directory, "type": "DirectoryOrCreate"}
    for name in ("device-plugin", "isolation"):
        c = container(spec, name)
        assert flags(c)["--interposer-dir"] == directory
        [mount] = [m for m in c["volumeMounts"] if m["name"] == "interposer"]
        assert mount["mountPath"] == directory and not mount.get("readOnly")


@pytest.mark.parametrize(
    "values",
    [{"isolation": {"interposer": {"enabled": False}}}, {"isolation": {"enabled": False}}],
    ids=["interposer-off", "agent-off"],
)
def test_without_the_interposer_no_container_gets_it(values):
    spec = render(values).one("DaemonSet")["spec"]["template"]["spec"]
    assert flags(container(spec, "device-plugin"))["--interposer-dir"] == ""
    assert "interposer" not in {v["name"] for v in spec["volumes"]}


def test_an_interposer_dir_that_is_not_absolute_is_refused():
    with pytest.raises(helm.HelmRenderError, match=r'isolation\.interposer\.dir "relative/dir"'):
        render({"isolation": {"interposer": {"dir": "relative/dir"}}})


def test_unprivileged_agent_gets_only_the_capabilities_it_uses():
    spec = render(VALUE_SETS["unprivileged-agent"]).one("DaemonSet")["spec"]["template"]["spec"]
    security = container(spec, "isolation")["securityContext"]
    assert "privileged" not in security
    assert spec["hostPID"] is False
    assert security["capabilities"] == {
        "drop": ["ALL"],
        "add": ["KILL", "SYS_PTRACE", "DAC_OVERRIDE"],
    }


def test_mock_backend_passes_the_layout_to_both_node_components():
    spec = render(VALUE_SETS["mock-backend"]).one("DaemonSet")["spec"]["template"]["spec"]
    for name in ("device-plugin", "isolation"):
        c = container(spec, name)
        assert flags(c)["--backend"] == "mock"
        assert flags(c)["--mock-gpus"] == "2x16GiB,1x80GiB:A100"
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["GPUSHARE_BACKEND"] == "mock"
        assert env["GPUSHARE_MOCK_GPUS"] == "2x16GiB,1x80GiB:A100"
        assert "NVIDIA_VISIBLE_DEVICES" not in env
        assert "--gpu-memory-rounding" not in flags(c)


@pytest.mark.parametrize(
    ("rounding", "flag"),
    [("down", "down"), (None, "up")],  # None: a release upgraded with --reuse-values
)
def test_memory_rounding_reaches_both_node_components(rounding, flag):
    rendered = render({"gpu": {"memoryRounding": rounding}})
    spec = rendered.one("DaemonSet")["spec"]["template"]["spec"]
    for name in ("device-plugin", "isolation"):
        assert flags(container(spec, name))["--gpu-memory-rounding"] == flag


@pytest.mark.parametrize(
    ("backend", "host_dev"), [("nvml", {"host-dev"}), ("mock", set())], ids=["nvml", "mock"]
)
def test_without_the_agent_the_node_pod_has_no_host_access_but_the_kubelets_and_dev(
    backend, host_dev
):
    values = {**VALUE_SETS["minimal"], "gpu": {"backend": backend}}
    spec = render(values).one("DaemonSet")["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["device-plugin"]
    assert "hostPID" not in spec
    assert {v["name"] for v in spec["volumes"]} == {
        "device-plugins",
        "pod-resources",
        "tmp",
        "kube-api-access",
        *host_dev,
    }
    mounts = {m["name"]: m for m in container(spec, "device-plugin")["volumeMounts"]}
    assert all(mounts[name]["readOnly"] is True for name in host_dev)


# ----- GPU nodes: the driver, the toolkit and the device files (docs/install.md)

DRIVER_ROOT = "/run/nvidia/driver"
NODE_CONTAINERS = ("device-plugin", "isolation")


def node_pod(values: dict, kube_version: str | None = None) -> dict:
    return render(values, kube_version=kube_version).one("DaemonSet")["spec"]["template"]["spec"]


def env_of(c: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in c["env"]}


def host_paths(spec: dict) -> dict[str, dict]:
    """hostPath volumes by name."""
    return {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}


def mounted_host_path(spec: dict, c: dict, mount_path: str) -> tuple[dict, dict]:
    """The mount of `c` at mount_path and the hostPath behind it."""
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == mount_path]
    return mount, host_paths(spec)[mount["name"]]


@pytest.mark.parametrize("values", [{}, VALUE_SETS["runtime-class"]], ids=["default", "runtime"])
def test_with_nvml_both_node_containers_ask_the_toolkit_for_the_driver(values):
    """The toolkit mounts libnvidia-ml.so.1 and /dev/nvidia* into a container whose
    environment says NVIDIA_VISIBLE_DEVICES=all; `utility` is the capability that
    brings NVML."""
    spec = node_pod(values)
    for name in NODE_CONTAINERS:
        env = env_of(container(spec, name))
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all", name
        assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(","), name
        assert "GPUSHARE_DRIVER_ROOT" not in env and "LD_LIBRARY_PATH" not in env, name
    assert "driver-root" not in host_paths(spec)


def test_with_mock_gpus_no_container_asks_for_the_driver_or_the_nodes_devices():
    spec = node_pod({"gpu": {"backend": "mock", "driverRoot": DRIVER_ROOT}})
    for name in NODE_CONTAINERS:
        c = container(spec, name)
        env = env_of(c)
        assert not {k for k in env if k.startswith("NVIDIA_")}, name
        assert "GPUSHARE_DRIVER_ROOT" not in env, name
        assert "--dev-root" not in flags(c), name
    assert "privileged" not in container(spec, "device-plugin")["securityContext"]
    assert {"host-dev", "driver-root"}.isdisjoint(host_paths(spec))


@pytest.mark.parametrize("backend", ["nvml", "mock"])
def test_runtime_class_is_rendered_when_set_and_absent_when_not(backend):
    with_class = node_pod({"gpu": {"backend": backend, "runtimeClassName": "nvidia"}})
    assert with_class["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in node_pod({"gpu": {"backend": backend}})


@pytest.mark.parametrize(
    "values",
    [{}, VALUE_SETS["runtime-class"], VALUE_SETS["driver-root"]],
    ids=["toolkit", "runtime-class", "driver-root"],
)
def test_the_plugin_looks_for_device_files_in_the_nodes_dev(values):
    """The plugin tells the kubelet which of nvidiactl, nvidia-uvm, nvidia-uvm-tools and
    nvidia-modeset exist: it looks in the node's /dev, not in its own (where the toolkit
    mounts only what NVML needs, and only at start)."""
    spec = node_pod(values)
    plugin = container(spec, "device-plugin")
    dev_root = flags(plugin)["--dev-root"]
    mount, host = mounted_host_path(spec, plugin, dev_root)
    assert host == {"path": "/dev", "type": "Directory"}
    assert mount["readOnly"] is True and dev_root != "/dev"
    assert "host-dev" not in {m["name"] for m in container(spec, "isolation")["volumeMounts"]}


@pytest.mark.parametrize(
    ("kube_version", "recursive"),
    [("v1.25.0", False), ("v1.30.4", False), ("v1.31.0", True), ("v1.33.1", True)],
)
def test_the_nodes_dev_is_read_only_down_to_its_submounts_where_the_cluster_can(
    kube_version, recursive
):
    """/dev/shm, /dev/pts ... of the node stay writable through a plain read-only
    mount; recursiveReadOnly (beta and on from 1.31) closes them where the runtime can."""
    plugin = container(node_pod({}, kube_version), "device-plugin")
    [mount] = [m for m in plugin["volumeMounts"] if m["name"] == "host-dev"]
    assert ("recursiveReadOnly" in mount) == recursive
    if recursive:
        assert mount["recursiveReadOnly"] == "IfPossible" and "mountPropagation" not in mount


def test_driver_root_is_mounted_into_both_containers_and_named_to_the_loader():
    spec = node_pod(VALUE_SETS["driver-root"])
    for name in NODE_CONTAINERS:
        c = container(spec, name)
        env = env_of(c)
        mount, host = mounted_host_path(spec, c, env["GPUSHARE_DRIVER_ROOT"])
        assert host == {"path": DRIVER_ROOT, "type": "Directory"}, name
        assert mount["readOnly"] is True, name
        # The GPU operator mounts its driver there after the node pod may have started.
        assert mount["mountPropagation"] == "HostToContainer", name
        # The toolkit leaves the pod alone; the library is loaded by its path.
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void", name
        assert "NVIDIA_DRIVER_CAPABILITIES" not in env, name
        # Not LD_LIBRARY_PATH: the driver root's lib directories hold its own libc,
        # which would then replace the image's (tests/nvmllib shows Python not starting).
        assert "LD_LIBRARY_PATH" not in env, name
        # Nothing else grants a container /dev/nvidia*, which NVML opens.
        assert c["securityContext"]["privileged"] is True, name
        assert "allowPrivilegeEscalation" not in c["securityContext"], name


def test_driver_root_without_the_agent_leaves_only_the_plugin_privileged():
    values = {**VALUE_SETS["driver-root"], "isolation": {"enabled": False}}
    spec = node_pod(values)
    [plugin] = spec["containers"]
    assert plugin["securityContext"]["privileged"] is True
    assert env_of(plugin)["GPUSHARE_DRIVER_ROOT"] == "/driver-root"


def test_driver_root_with_an_unprivileged_agent_fails_with_the_reason():
    values = {**VALUE_SETS["driver-root"], "isolation": {"privileged": False}}
    reason = re.escape("gpu.driverRoot needs isolation.privileged=true")
    with pytest.raises(helm.HelmRenderError, match=reason):
        render(values)


@pytest.mark.parametrize(
    "values",
    [{}, VALUE_SETS["runtime-class"], VALUE_SETS["driver-root"]],
    ids=["toolkit", "runtime-class", "driver-root"],
)
def test_the_agent_sees_host_pids_proc_and_cgroups_in_every_setup(values):
    spec = node_pod(values)
    agent = container(spec, "isolation")
    assert spec["hostPID"] is True and agent["securityContext"]["privileged"] is True
    proc_mount, proc = mounted_host_path(spec, agent, flags(agent)["--proc-root"])
    assert proc["path"] == "/proc" and proc_mount["readOnly"] is True
    cgroup_mount, cgroup = mounted_host_path(spec, agent, flags(agent)["--cgroup-root"])
    assert cgroup["path"] == "/sys/fs/cgroup" and not cgroup_mount.get("readOnly")


def test_install_guide_says_what_the_chart_renders_on_gpu_nodes():
    text = (CHART.parents[1] / "docs" / "install.md").read_text()
    heading = "## GPU nodes: the driver, the toolkit and the device files"
    assert heading in text
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    default = node_pod({})
    plugin = container(default, "device-plugin")
    driver_root = env_of(container(node_pod(VALUE_SETS["driver-root"]), "isolation"))
    said = [
        "NVIDIA_VISIBLE_DEVICES=all",
        f"NVIDIA_DRIVER_CAPABILITIES={env_of(plugin)['NVIDIA_DRIVER_CAPABILITIES']}",
        "gpu.runtimeClassName",
        "gpu.driverRoot",
        DRIVER_ROOT,
        f"GPUSHARE_DRIVER_ROOT={driver_root['GPUSHARE_DRIVER_ROOT']}",
        f"NVIDIA_VISIBLE_DEVICES={driver_root['NVIDIA_VISIBLE_DEVICES']}",
        f"--dev-root={flags(plugin)['--dev-root']}",
        "hostPID",
        "privileged",
        flags(container(default, "isolation"))["--proc-root"],
        flags(container(default, "isolation"))["--cgroup-root"],
        "pynvml.nvmlDeviceGetCount()",
        "ls /dev/nvidia*",
        "control-devices=",
        "deviceplugin.md#testing-the-nvml-path-without-a-gpu",
    ]
    assert [s for s in said if s not in section] == []


# ----- the scheduler Deployment and its configuration


def test_scheduler_runs_stock_kube_scheduler_with_the_extender_as_sidecar(default):
    deployment = default.one("Deployment", f"{FULLNAME}-scheduler")
    assert deployment["spec"]["replicas"] == 2
    spec = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["kube-scheduler", "extender"]
    scheduler = container(spec, "kube-scheduler")
    assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.\d+\.0", scheduler["image"])
    config_path = flags(scheduler)["--config"]
    mount = next(m for m in scheduler["volumeMounts"] if config_path.startswith(m["mountPath"]))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == f"{FULLNAME}-scheduler-config"
    assert Path(config_path).name in {i["path"] for i in volume["configMap"]["items"]}

    extender = container(spec, "extender")
    assert extender["command"] == ["gpushare-extender"]
    assert flags(extender) == {
        "--scheduler-address": "127.0.0.1",
        "--port": "39999",
        "--host": "0.0.0.0",
        "--ops-port": "39998",
        "--url-prefix": "/gpushare-scheduler",
        "--scheduler-name": "gpushare-scheduler",
        "--extra-scheduler-names": "ack-co-scheduler",
        "--default-placement": "fgd-lookahead",
        "--max-pods-per-gpu": "20",
        "--log-level": "info",
        "--webhook-port": "9443",
        "--tls-cert-file": "/etc/gpushare/webhook/tls.crt",
        "--tls-key-file": "/etc/gpushare/webhook/tls.key",
    }
    assert extender["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_scheduler_image_tag_can_be_pinned():
    spec = render({"scheduler": {"image": {"tag": "v1.30.4"}}}).one("Deployment")["spec"]
    image = container(spec["template"]["spec"], "kube-scheduler")["image"]
    assert image == "registry.k8s.io/kube-scheduler:v1.30.4"


# Keys kube-scheduler accepts (it decodes the file strictly: anything else is fatal).
CONFIG_KEYS = {
    "apiVersion", "kind", "leaderElection", "profiles", "percentageOfNodesToScore",
    "extenders", "clientConnection", "parallelism", "podInitialBackoffSeconds",
    "podMaxBackoffSeconds", "featureGates", "enableProfiling", "enableContentionProfiling",
    "delayCacheUntilActive",
}  # fmt: skip
LEADER_KEYS = {
    "leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock",
    "resourceName", "resourceNamespace",
}  # fmt: skip
EXTENDER_KEYS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb",
    "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources",
    "ignorable",
}  # fmt: skip
PROFILE_KEYS = {"schedulerName", "plugins", "pluginConfig", "percentageOfNodesToScore"}
FIT_ARGS_KEYS = {"ignoredResources", "ignoredResourceGroups", "scoringStrategy"}
EXTENDED_RESOURCE = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_scheduler_configuration_is_valid_for_kube_scheduler(values):
    rendered = render(values)
    config = scheduler_config(rendered)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert set(config) <= CONFIG_KEYS
    assert set(config["leaderElection"]) <= LEADER_KEYS
    assert config["leaderElection"]["resourceName"] != "kube-scheduler"
    assert [p["schedulerName"] for p in config["profiles"]] == [
        "gpushare-scheduler",
        "ack-co-scheduler",
    ]
    for profile in config["profiles"]:
        assert set(profile) <= PROFILE_KEYS
        for plugin in profile["pluginConfig"]:
            assert set(plugin) == {"name", "args"} and plugin["name"] == "NodeResourcesFit"
            assert set(plugin["args"]) <= FIT_ARGS_KEYS
            strategy = plugin["args"]["scoringStrategy"]
            assert set(strategy) <= {"type", "resources", "requestedToCapacityRatio"}
            assert strategy["type"] in ("LeastAllocated", "MostAllocated")
            for resource in strategy["resources"]:
                assert set(resource) == {"name", "weight"} and 1 <= resource["weight"] <= 100
    assert config["percentageOfNodesToScore"] == 100
    extender, *claims = config["extenders"]  # DRA mode's second entry: tests/chart/test_dra.py
    for entry in claims:
        assert set(entry) <= EXTENDER_KEYS and "managedResources" not in entry
        assert entry["prioritizeVerb"] and entry["weight"] == extender["weight"]
    assert len(claims) == (1 if values.get("dra", {}).get("enabled") else 0)
    assert set(extender) <= EXTENDER_KEYS
    assert extender["prioritizeVerb"] and extender["weight"] >= 20
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert extender["preemptVerb"] == "preempt"
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is False
    assert re.fullmatch(r"\d+(ms|s|m)", extender["httpTimeout"])
    names = [r["name"] for r in extender["managedResources"]]
    assert sorted(names) == sorted(MANAGED_RESOURCES)
    for resource in extender["managedResources"]:
        assert set(resource) == {"name", "ignoredByScheduler"}
        assert EXTENDED_RESOURCE.fullmatch(resource["name"])
        assert not resource["name"].split("/")[0].endswith("kubernetes.io")
        assert resource["ignoredByScheduler"] is False
    # The scheduler calls its own sidecar: the URL is the extender's port and prefix.
    spec = rendered.one("Deployment")["spec"]["template"]["spec"]
    extender_flags = flags(container(spec, "extender"))
    assert extender["urlPrefix"] == (
        f"http://127.0.0.1:{extender_flags['--port']}{extender_flags['--url-prefix']}"
    )


def test_only_kube_scheduler_reaches_the_verbs_and_the_service_the_operational_port(default):
    spec = default.one("Deployment")["spec"]["template"]["spec"]
    extender = container(spec, "extender")
    extender_flags = flags(extender)
    # The verbs listen on loopback, where the scheduler's URL points; no port exposes them.
    assert extender_flags["--scheduler-address"] == "127.0.0.1"
    assert urlsplit(scheduler_config(default)["extenders"][0]["urlPrefix"]).hostname == (
        "127.0.0.1"
    )
    exposed = {str(p["containerPort"]) for p in extender["ports"]}
    assert extender_flags["--port"] not in exposed
    # Probes, the Service and the ServiceMonitor reach the operational port.
    [http] = [p for p in extender["ports"] if p["name"] == "http"]
    assert str(http["containerPort"]) == extender_flags["--ops-port"]
    assert extender["livenessProbe"]["httpGet"]["port"] == "http"
    assert extender["readinessProbe"]["httpGet"]["port"] == "http"
    service = default.one("Service", f"{FULLNAME}-extender")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert (ports["http"]["port"], ports["http"]["targetPort"]) == (http["containerPort"], "http")
    assert {p["targetPort"] for p in ports.values()} <= {p["name"] for p in extender["ports"]}


def profile_names(rendered) -> list[str]:
    return [p["schedulerName"] for p in scheduler_config(rendered)["profiles"]]


def served_by_extender(rendered) -> tuple[str, ...]:
    """The names the extender serves, parsed by the extender from the chart's flags."""
    from gpushare.extender.main import build_parser, config_from

    spec = rendered.one("Deployment")["spec"]["template"]["spec"]
    argv = [f"{k}={v}" for k, v in flags(container(spec, "extender")).items()
            if k in ("--scheduler-name", "--extra-scheduler-names")]  # fmt: skip
    return config_from(build_parser().parse_args(argv)).scheduler_names


def test_each_extra_scheduler_name_is_one_more_profile_of_the_same_scheduler():
    rendered = render(
        {"scheduler": {"name": "gpu", "extraSchedulerNames": ["ack-co-scheduler", "team.gpu"]}}
    )
    config = scheduler_config(rendered)
    assert profile_names(rendered) == ["gpu", "ack-co-scheduler", "team.gpu"]
    # Alike but for the name (plugins, pluginConfig, queueSort), so each places pods as
    # the first; the extender and percentageOfNodesToScore are global to all profiles.
    bodies = [{k: v for k, v in p.items() if k != "schedulerName"} for p in config["profiles"]]
    assert all(body == bodies[0] for body in bodies)
    assert len(config["extenders"]) == 1 and config["percentageOfNodesToScore"] == 100
    assert served_by_extender(rendered) == ("gpu", "ack-co-scheduler", "team.gpu")


@pytest.mark.parametrize("extra", [[], None], ids=["none", "older-release"])
def test_without_extra_names_the_scheduler_serves_its_name_alone(extra):
    """None: absent, as in a release upgraded with --reuse-values from an older chart."""
    rendered = render({"scheduler": {"extraSchedulerNames": extra}})
    assert profile_names(rendered) == ["gpushare-scheduler"]
    assert served_by_extender(rendered) == ("gpushare-scheduler",)


def test_by_default_the_extender_serves_exactly_the_profiles(default):
    assert served_by_extender(default) == tuple(profile_names(default))
    assert profile_names(default) == ["gpushare-scheduler", "ack-co-scheduler"]


def test_an_extra_name_equal_to_the_main_one_fails_with_the_reason():
    reason = re.escape("gpushare-scheduler is scheduler.name already")
    with pytest.raises(helm.HelmRenderError, match=reason):
        render({"scheduler": {"extraSchedulerNames": ["ack-co-scheduler", "gpushare-scheduler"]}})


def test_leader_election_lease_is_its_own_and_in_the_release_namespace(default):
    election = scheduler_config(default)["leaderElection"]
    assert election == {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceNamespace": NAMESPACE,
        "resourceName": "gpushare-scheduler",
    }


# ----- the admission webhooks


def webhooks(rendered) -> dict[str, dict]:
    return {
        kind: rendered.one(kind)["webhooks"]
        for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
    }


@pytest.mark.parametrize("values", [{}, VALUE_SETS["failure-ignore"]], ids=["fail", "ignore"])
def test_webhooks_send_pod_creation_to_the_extender_service(values):
    rendered = render(values)
    service = rendered.one("Service", f"{FULLNAME}-extender")
    port = next(p for p in service["spec"]["ports"] if p["name"] == "webhook")
    deployment = rendered.one("Deployment")["spec"]["template"]["spec"]
    extender = container(deployment, "extender")
    container_port = next(p for p in extender["ports"] if p["name"] == port["targetPort"])
    assert str(container_port["containerPort"]) == flags(extender)["--webhook-port"]
    expected_policy = values.get("webhook", {}).get("failurePolicy", "Fail")
    for kind, path in (("ValidatingWebhookConfiguration", "/validate"),
                       ("MutatingWebhookConfiguration", "/mutate")):  # fmt: skip
        [hook] = webhooks(rendered)[kind]
        assert hook["clientConfig"]["service"] == {
            "name": service["metadata"]["name"],
            "namespace": NAMESPACE,
            "path": path,
            "port": port["port"],
        }
        assert base64.b64decode(hook["clientConfig"]["caBundle"]).startswith(
            b"-----BEGIN CERTIFICATE-----"
        )
        assert hook["rules"] == [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]
        assert hook["failurePolicy"] == expected_policy
        assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
        [expression] = hook["namespaceSelector"]["matchExpressions"]
        assert expression["operator"] == "NotIn"
        assert {"kube-system", NAMESPACE} <= set(expression["values"])
        assert ("matchConditions" in hook) == (expected_policy == "Fail")


def test_match_condition_selects_pods_naming_our_resources(default):
    [hook] = webhooks(default)["ValidatingWebhookConfiguration"]
    [condition] = hook["matchConditions"]
    expression = condition["expression"]
    assert "object.spec.containers.exists" in expression
    assert "object.spec.initContainers.exists" in expression
    assert expression.count("k.startsWith('aliyun.com/gpu-')") == 4  # limits and requests, x2
    # Resources alone decide: a GPU pod naming any scheduler reaches the webhook, which
    # checks it and warns when nobody serves that name.
    assert "schedulerName" not in expression and "objectSelector" not in hook
    assert all(r.startswith("aliyun.com/gpu-") for r in MANAGED_RESOURCES)


def test_generated_certificate_serves_tls_for_the_service_name(default):
    """A real TLS handshake: the chart's key and certificate on the server side, the
    webhook's caBundle on the client side, the host name the API server dials."""
    secret = default.one("Secret", f"{FULLNAME}-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    [hook] = webhooks(default)["ValidatingWebhookConfiguration"]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == data["ca.crt"]
    host = f"{FULLNAME}-extender.{NAMESPACE}.svc"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tls.crt").write_bytes(data["tls.crt"])
        (Path(tmp) / "tls.key").write_bytes(data["tls.key"])
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(Path(tmp) / "tls.crt", Path(tmp) / "tls.key")
    client = ssl.create_default_context(cadata=data["ca.crt"].decode())
    left, right = socket.socketpair()
    with left, right:
        served = threading.Thread(target=lambda: server.wrap_socket(left, server_side=True).close())
        served.start()
        with client.wrap_socket(right, server_hostname=host) as tls:
            assert tls.version() is not None
        served.join(timeout=10)


def test_deployment_mounts_the_certificate_secret(default):
    spec = default.one("Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "webhook-tls")
    assert volume["secret"]["secretName"] == f"{FULLNAME}-webhook-tls"
    mount = next(
        m for m in container(spec, "extender")["volumeMounts"] if m["name"] == "webhook-tls"
    )
    cert = flags(container(spec, "extender"))["--tls-cert-file"]
    assert cert == f"{mount['mountPath']}/tls.crt"


@pytest.mark.parametrize("name", ["cert-manager", "cert-manager-own-issuer"])
def test_cert_manager_issues_the_certificate_and_injects_the_ca(name):
    values = VALUE_SETS[name]
    rendered = render(values)
    assert rendered.all("Secret") == []
    certificate = rendered.one("Certificate")
    assert certificate["spec"]["secretName"] == f"{FULLNAME}-webhook-tls"
    assert f"{FULLNAME}-extender.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    own = values["webhook"]["certManager"].get("issuerRef")
    if own:
        assert rendered.all("Issuer") == [] and certificate["spec"]["issuerRef"] == own
    else:
        issuer = rendered.one("Issuer")
        assert issuer["spec"] == {"selfSigned": {}}
        assert certificate["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    for kind, hooks in webhooks(rendered).items():
        annotations = rendered.one(kind)["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == (
            f"{NAMESPACE}/{certificate['metadata']['name']}"
        )
        assert "caBundle" not in hooks[0]["clientConfig"]


def test_webhook_off_renders_no_webhook_and_no_tls_flags():
    rendered = render(VALUE_SETS["minimal"])
    assert rendered.all("ValidatingWebhookConfiguration") == []
    assert rendered.all("MutatingWebhookConfiguration") == []
    extender = container(rendered.one("Deployment")["spec"]["template"]["spec"], "extender")
    assert "--tls-cert-file" not in flags(extender)
    assert "set for you by the webhook" not in rendered.notes
    assert "pods must set spec.schedulerName: gpushare-scheduler" in rendered.notes


def test_installing_into_kube_system_excludes_it_once():
    rendered = render(namespace="kube-system")
    [hook] = webhooks(rendered)["MutatingWebhookConfiguration"]
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system"]


# ----- the webhooks on clusters with and without matchConditions

WITH_MATCH_CONDITIONS = ["v1.28.0", "v1.33.1", "v1.28.9-gke.1000000"]
WITHOUT_MATCH_CONDITIONS = ["v1.25.0", "v1.27.3", "v1.27.16-eks-2f46c53"]
DEPENDS_ON_THE_EXTENDER = "non-GPU pods depend on the extender"


def hooks_at(values: dict, kube_version: str) -> list[dict]:
    """Both webhooks (validating, mutating) as the chart renders them on that version."""
    configurations = webhook_configurations(values, kube_version)
    assert [c["kind"] for c in configurations] == [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ]
    return [hook for c in configurations for hook in c["webhooks"]]


@pytest.mark.parametrize("kube_version", WITHOUT_MATCH_CONDITIONS)
def test_without_match_conditions_by_default_non_gpu_pods_never_wait_for_the_extender(
    kube_version,
):
    """Below 1.28 the API server has no matchConditions (or drops them): both webhooks
    see every pod, so a down extender must not refuse them."""
    rendered = render(kube_version=kube_version)
    hooks = [hook for hooks in webhooks(rendered).values() for hook in hooks]
    assert [h["name"] for h in hooks] == ["validate.pods.gpushare.io", "mutate.pods.gpushare.io"]
    for hook in hooks:
        assert "matchConditions" not in hook
        assert hook["failurePolicy"] == "Ignore"
    notes = " ".join(rendered.notes.split())
    assert "failurePolicy is Ignore: pods that ask for no GPU never depend on gpushare" in notes
    assert "WARNING: the webhook" not in notes


@pytest.mark.parametrize("kube_version", WITH_MATCH_CONDITIONS)
def test_with_match_conditions_by_default_only_gpu_pods_reach_a_failing_webhook(kube_version):
    rendered = render(kube_version=kube_version)
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        [hook] = rendered.one(kind)["webhooks"]
        assert [c["name"] for c in hook["matchConditions"]] == ["asks-for-shared-gpu"]
        assert hook["failurePolicy"] == "Fail"
    assert "WARNING: the webhook" not in rendered.notes
    assert "no matchConditions" not in rendered.notes


@pytest.mark.parametrize("match_conditions", [False, "auto", True])
@pytest.mark.parametrize("kube_version", ["v1.25.0", "v1.27.3", "v1.28.0", "v1.33.1"])
def test_auto_failure_policy_follows_whether_match_conditions_are_rendered(
    kube_version, match_conditions
):
    hooks = hooks_at({"webhook": {"matchConditions": match_conditions}}, kube_version)
    rendered = match_conditions is True or (
        match_conditions == "auto" and kube_version in ("v1.28.0", "v1.33.1")
    )
    for hook in hooks:
        assert ("matchConditions" in hook) == rendered
        assert hook["failurePolicy"] == ("Fail" if rendered else "Ignore")


def test_match_conditions_turned_off_on_a_new_cluster_mean_ignore():
    for hook in hooks_at({"webhook": {"matchConditions": False}}, "1.33"):
        assert "matchConditions" not in hook and hook["failurePolicy"] == "Ignore"


@pytest.mark.parametrize(
    ("kube_version", "match_conditions"), [("v1.27.3", "auto"), ("v1.33.1", False)]
)
def test_explicit_fail_without_match_conditions_renders_fail_and_the_notes_warn(
    kube_version, match_conditions
):
    values = {"webhook": {"failurePolicy": "Fail", "matchConditions": match_conditions}}
    rendered = render(values, kube_version=kube_version)
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        [hook] = rendered.one(kind)["webhooks"]
        assert "matchConditions" not in hook and hook["failurePolicy"] == "Fail"
    notes = " ".join(rendered.notes.split())
    assert "WARNING: the webhook has failurePolicy Fail but no matchConditions" in notes
    assert DEPENDS_ON_THE_EXTENDER in notes
    assert f"creating any pod outside kube-system, {NAMESPACE} fails with" in notes
    assert "failed calling webhook mutate.pods.gpushare.io ... connection refused" in notes
    assert "webhook.failurePolicy=auto" in notes


def test_explicit_choices_are_kept_where_they_are_safe():
    for hook in hooks_at({"webhook": {"failurePolicy": "Ignore"}}, "v1.33.1"):
        assert hook["failurePolicy"] == "Ignore" and "matchConditions" in hook
    rendered = render({"webhook": {"matchConditions": True}}, kube_version="v1.27.3")
    [hook] = rendered.one("MutatingWebhookConfiguration")["webhooks"]
    assert hook["failurePolicy"] == "Fail" and "matchConditions" in hook
    assert "WARNING: the webhook" not in rendered.notes


def test_opt_in_selectors_narrow_a_failing_webhook_without_match_conditions():
    """The recipe in docs/install.md for Fail on clusters below 1.28: only labelled pods
    (in labelled namespaces) reach the webhook."""
    rendered = render(VALUE_SETS["opt-in-selectors"], kube_version="v1.27.3")
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        [hook] = rendered.one(kind)["webhooks"]
        assert hook["failurePolicy"] == "Fail" and "matchConditions" not in hook
        assert hook["objectSelector"] == {"matchLabels": {"gpushare.io/webhook": "true"}}
        selector = hook["namespaceSelector"]
        assert selector["matchLabels"] == {"gpushare.io/gpu-workloads": "true"}
        [excluded] = selector["matchExpressions"]
        assert excluded["key"] == "kubernetes.io/metadata.name"
        assert excluded["operator"] == "NotIn"
    notes = " ".join(rendered.notes.split())
    assert DEPENDS_ON_THE_EXTENDER in notes
    assert "make sure they select only GPU pods" in notes


def test_namespace_selector_expressions_are_added_to_the_exclusions():
    expression = {"key": "team", "operator": "In", "values": ["ml"]}
    [hook, _] = hooks_at(
        {"webhook": {"namespaceSelector": {"matchExpressions": [expression]}}}, "v1.27.3"
    )
    assert hook["namespaceSelector"]["matchExpressions"][1:] == [expression]
    assert hook["namespaceSelector"]["matchExpressions"][0]["operator"] == "NotIn"
    assert "matchLabels" not in hook["namespaceSelector"]


def test_values_of_an_older_release_still_render():
    """`helm upgrade --reuse-values` starts from the previous chart's values: the
    booleans of before `auto`, and no namespaceSelector at all (null drops the key)."""
    old = {"webhook": {"failurePolicy": "Fail", "matchConditions": True, "namespaceSelector": None}}
    [hook, _] = hooks_at(old, "v1.33.1")
    assert hook["failurePolicy"] == "Fail" and "matchConditions" in hook
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", NAMESPACE],
            }
        ]
    }


@pytest.mark.parametrize("kube_version", ["v1.25.0", "v1.27.3", "v1.28.0", "v1.33.1"])
@pytest.mark.parametrize(
    "values",
    [{}, VALUE_SETS["fail-without-match-conditions"], VALUE_SETS["opt-in-selectors"]],
    ids=["defaults", "fail-without-match-conditions", "opt-in-selectors"],
)
def test_webhooks_load_into_the_api_models_on_every_supported_version(kube_version, values):
    for configuration in webhook_configurations(values, kube_version):
        assert dropped_fields(configuration) == []


def test_render_helper_returns_both_configurations_for_a_version():
    objects = render_chart({}, "1.27")
    configurations = webhook_configurations({}, "1.27")
    by_kind = {o["kind"]: o for o in objects}
    assert [c["kind"] for c in configurations] == [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ]
    # The same but for the CA, which the chart generates anew on each rendering.
    for configuration in configurations:
        ours = by_kind[configuration["kind"]]
        for hook, same in zip(configuration["webhooks"], ours["webhooks"], strict=True):
            hook["clientConfig"].pop("caBundle")
            same["clientConfig"].pop("caBundle")
            assert hook == same
    assert [c["metadata"]["name"] for c in configurations] == [FULLNAME, FULLNAME]
    assert webhook_configurations(VALUE_SETS["minimal"], "1.33") == []
    other = webhook_configurations({}, "v1.33.1", namespace="gpu", release="rel")
    assert other[0]["metadata"]["name"] == "rel-gpushare"
    assert other[0]["webhooks"][0]["clientConfig"]["service"]["namespace"] == "gpu"


@pytest.mark.parametrize("kube_version", ["v1.25.0", "v1.27.3", "v1.33.1"])
def test_helm_lint_is_clean_on_every_supported_version(kube_version):
    report = helm.lint(CHART, {}, strict=True, namespace=NAMESPACE, kube_version=kube_version)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


# ----- RBAC


def allows(rules: list[dict], verb: str, resource: str, group: str = "", name: str = "") -> bool:
    for rule in rules:
        if group not in rule.get("apiGroups", []) and "*" not in rule.get("apiGroups", []):
            continue
        if resource not in rule["resources"] and "*" not in rule["resources"]:
            continue
        if verb not in rule["verbs"] and "*" not in rule["verbs"]:
            continue
        if rule.get("resourceNames") and name not in rule["resourceNames"]:
            continue
        return True
    return False


def granted(rendered, service_account: str) -> tuple[list[dict], set[str]]:
    """Rules of the chart's own roles bound to the account, and the names of the
    roles it is bound to that the chart does not define (built-in ones)."""
    roles = {(r["kind"], r["metadata"]["name"]): r for r in rendered.all("ClusterRole")}
    roles |= {(r["kind"], r["metadata"]["name"]): r for r in rendered.all("Role")}
    rules: list[dict] = []
    external: set[str] = set()
    for binding in [*rendered.all("ClusterRoleBinding"), *rendered.all("RoleBinding")]:
        if not any(s["name"] == service_account for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], ref["name"]))
        if role is None:
            external.add(ref["name"])
        else:
            rules.extend(role["rules"])
    return rules, external


def test_scheduler_account_binds_pods_and_holds_only_its_own_lease(default):
    rules, builtin = granted(default, f"{FULLNAME}-scheduler")
    assert builtin == {
        "system:kube-scheduler",
        "system:volume-scheduler",
        "extension-apiserver-authentication-reader",
    }
    assert allows(rules, "create", "pods/binding")
    assert allows(rules, "patch", "pods")
    for verb in ("list", "watch"):  # nodes get: the built-in roles (tests/chart/test_rbac.py)
        assert allows(rules, verb, "nodes") and allows(rules, verb, "pods")
    assert allows(rules, "get", "pods")
    assert allows(rules, "create", "events")
    assert allows(rules, "update", "leases", "coordination.k8s.io", "gpushare-scheduler")
    assert not allows(rules, "update", "leases", "coordination.k8s.io", "kube-scheduler")
    assert not allows(rules, "patch", "nodes")
    assert not allows(rules, "get", "secrets")


def test_device_plugin_can_annotate_but_never_bind(default):
    rules, builtin = granted(default, f"{FULLNAME}-device-plugin")
    assert builtin == set()
    for verb in ("get", "list", "watch", "patch"):
        assert allows(rules, verb, "pods")
    for verb in ("list", "watch", "patch"):
        assert allows(rules, verb, "nodes")
    assert allows(rules, "create", "events")
    assert not allows(rules, "create", "pods/binding")
    assert not allows(rules, "create", "bindings")
    assert not allows(rules, "delete", "pods")
    assert not allows(rules, "get", "secrets")
    assert all("*" not in r["verbs"] and "*" not in r["resources"] for r in rules)


def test_every_binding_names_an_account_the_chart_creates(default):
    accounts = {a["metadata"]["name"] for a in default.all("ServiceAccount")}
    assert accounts == {
        f"{FULLNAME}-scheduler",
        f"{FULLNAME}-device-plugin",
        f"{FULLNAME}-uninstall-cleanup",
    }
    for binding in [*default.all("ClusterRoleBinding"), *default.all("RoleBinding")]:
        for subject in binding["subjects"]:
            assert subject == {
                "kind": "ServiceAccount",
                "name": subject["name"],
                "namespace": NAMESPACE,
            }
            assert subject["name"] in accounts
    pods = [default.one("DaemonSet"), default.one("Deployment"), default.one("Job")]
    assert {p["spec"]["template"]["spec"]["serviceAccountName"] for p in pods} == accounts


# ----- the uninstall hook: what the components made at run time goes with the release

HOOK = f"{FULLNAME}-uninstall-cleanup"
HOOK_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Job"}


def hook_objects(rendered) -> list[dict]:
    return [o for o in rendered.objects if "helm.sh/hook" in o["metadata"].get("annotations", {})]


def named_grants(rendered, account: str, resource: str, verb: str) -> set[tuple[str, str]]:
    """(namespace, name) of each object of `resource` the account may `verb` through the
    chart's Roles; a rule without resourceNames counts as (namespace, "*")."""
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in rendered.all("Role")}
    found: set[tuple[str, str]] = set()
    for binding in rendered.all("RoleBinding"):
        if not any(s["name"] == account for s in binding["subjects"]):
            continue
        namespace = binding["metadata"]["namespace"]
        role = roles.get((namespace, binding["roleRef"]["name"]), {"rules": []})  # built-in: none
        for rule in role["rules"]:
            if resource in rule["resources"] and verb in rule["verbs"]:
                found |= {(namespace, name) for name in rule.get("resourceNames", ["*"])}
    return found


def hook_command(rendered) -> argparse.Namespace:
    """The hook Job's command line as `gpushare` itself parses it."""
    from gpushare.cli.main import build_parser

    spec = rendered.one("Job", HOOK)["spec"]["template"]["spec"]
    c = container(spec, "uninstall-cleanup")
    program, *argv = c["command"] + c.get("args", [])
    scripts = tomllib.loads((CHART.parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[program] == "gpushare.cli.main:main"
    return build_parser().parse_args(argv)


RENAMED_LEASES = {
    "scheduler": {"leaderElection": {"resourceName": "gpu-sched", "resourceNamespace": "infra"}},
    "extender": {"leaseName": "gpu-ext"},
}


def test_the_hook_runs_after_uninstall_with_its_rbac_first(default):
    hooks = hook_objects(default)
    assert {(o["kind"], o["metadata"]["name"]) for o in hooks} == {(k, HOOK) for k in HOOK_KINDS}
    for obj in hooks:
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "post-delete"
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "gpushare"
        assert labels["app.kubernetes.io/instance"] == "gs"
        assert labels["app.kubernetes.io/component"] == "uninstall-cleanup"
    weight = {o["kind"]: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for o in hooks}
    assert all(weight[kind] < weight["Job"] for kind in HOOK_KINDS - {"Job"})
    assert hook_command(default).command == "uninstall-cleanup"


@pytest.mark.parametrize(
    "values", [{}, RENAMED_LEASES, VALUE_SETS["minimal"]], ids=["defaults", "renamed", "minimal"]
)
def test_the_hook_deletes_exactly_the_leases_the_scheduler_pod_may_hold(values):
    """The scheduler pod's account (kube-scheduler and the extender) may write the
    Leases its Role names; the hook's Role may delete those and no other, and the Job
    names the same ones."""
    rendered = render(values)
    held = named_grants(rendered, f"{FULLNAME}-scheduler", "leases", "update")
    election = scheduler_config(rendered)["leaderElection"]
    assert (election["resourceNamespace"], election["resourceName"]) in held
    assert len(held) == 2  # kube-scheduler's and the extender's
    assert named_grants(rendered, HOOK, "leases", "delete") == held
    assert {(o.namespace, o.name) for o in hook_command(rendered).lease} == held


def test_the_hook_may_patch_nodes_and_nothing_else_cluster_wide(default):
    assert default.one("ClusterRole", HOOK)["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}
    ]
    rules, builtin = granted(default, HOOK)
    assert builtin == set()
    assert not allows(rules, "delete", "leases", "coordination.k8s.io", "kube-scheduler")
    assert not allows(rules, "patch", "pods") and not allows(rules, "get", "secrets")
    assert named_grants(default, HOOK, "secrets", "delete") == set()
    assert hook_command(default).secret == []


@pytest.mark.parametrize("name", ["cert-manager", "cert-manager-own-issuer"])
def test_with_cert_manager_the_hook_deletes_the_secret_it_leaves(name):
    """cert-manager keeps a Certificate's Secret when the Certificate goes (unless its
    controller runs with --enable-certificate-owner-ref); the chart's own Secret is a
    release object, which Helm deletes."""
    rendered = render(VALUE_SETS[name])
    secret = (NAMESPACE, rendered.one("Certificate")["spec"]["secretName"])
    assert named_grants(rendered, HOOK, "secrets", "delete") == {secret}
    assert {(o.namespace, o.name) for o in hook_command(rendered).secret} == {secret}


def test_the_hook_job_is_short_unprivileged_and_placed_like_the_scheduler():
    tolerations = [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]
    values = {
        "scheduler": {"tolerations": tolerations, "nodeSelector": {"pool": "system"}},
        "imagePullSecrets": [{"name": "registry"}],
        "image": {"tag": "1.2.3", "pullPolicy": "Always"},
    }
    rendered = render(values)
    job = rendered.one("Job", HOOK)["spec"]
    assert 0 < job["backoffLimit"] <= 3 and 0 < job["activeDeadlineSeconds"] <= 300
    spec = job["template"]["spec"]
    scheduler = rendered.one("Deployment")["spec"]["template"]["spec"]
    for key in ("tolerations", "nodeSelector", "imagePullSecrets"):
        assert spec[key] == scheduler[key], key
    assert spec["serviceAccountName"] == HOOK and spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["runAsNonRoot"] is True
    c = container(spec, "uninstall-cleanup")
    extender = container(scheduler, "extender")
    assert (c["image"], c["imagePullPolicy"]) == (extender["image"], extender["imagePullPolicy"])
    assert c["image"].endswith(":1.2.3")
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


def test_the_hook_is_off_by_the_value_and_without_rbac_brings_none():
    assert hook_objects(render({"uninstallCleanup": {"enabled": False}})) == []
    kinds = {o["kind"] for o in hook_objects(render({"rbac": {"create": False}}))}
    assert kinds == {"ServiceAccount", "Job"}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_nothing_is_kept_after_uninstall(values):
    """helm.sh/resource-policy: keep would leave an object behind `helm uninstall`."""
    for obj in render(values).objects:
        annotations = obj["metadata"].get("annotations", {})
        assert "helm.sh/resource-policy" not in annotations, obj["metadata"]["name"]


def test_install_guide_says_what_the_uninstall_hook_removes(default):
    from gpushare.inventory import NODE_GPUS_ANNOTATION

    text = (CHART.parents[1] / "docs" / "install.md").read_text()
    section = text.split("## Uninstall", 1)[1].split("\n## ", 1)[0]
    said = [
        NODE_GPUS_ANNOTATION,
        "gpushare uninstall-cleanup",
        "uninstallCleanup.enabled",
        "--no-hooks",
        "keep their GPUs",
        *(name for _, name in named_grants(default, HOOK, "leases", "delete")),
    ]
    assert [s for s in said if s not in section] == []


# ----- metrics and the dashboard


def test_no_network_policy_unless_asked(default):
    assert default.all("NetworkPolicy") == []


def test_the_network_policy_lets_in_the_api_server_to_the_webhook_and_monitoring_to_metrics():
    rendered = render(
        {"networkPolicy": {"enabled": True, "apiServerCidrs": ["10.0.0.0/24", "fd00::/64"]}}
    )
    policy = rendered.one("NetworkPolicy")
    pods = rendered.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pods.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # whatever no rule names is refused
    webhook, metrics = policy["spec"]["ingress"]
    assert webhook == {
        "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}, {"ipBlock": {"cidr": "fd00::/64"}}],
        "ports": [{"port": "webhook", "protocol": "TCP"}],
    }
    assert metrics == {
        "from": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ],
        "ports": [{"port": "http", "protocol": "TCP"}],
    }
    extender = container(rendered.one("Deployment")["spec"]["template"]["spec"], "extender")
    assert {"webhook", "http"} == {p["name"] for p in extender["ports"]}


def test_the_network_policy_without_the_api_servers_cidrs_fails_with_the_reason():
    with pytest.raises(helm.HelmRenderError, match=r"networkPolicy\.apiServerCidrs: set the CIDRs"):
        render({"networkPolicy": {"enabled": True}})


def test_without_the_webhook_the_network_policy_needs_no_cidrs_and_names_no_webhook():
    policy = render({"networkPolicy": {"enabled": True}, "webhook": {"enabled": False}}).one(
        "NetworkPolicy"
    )
    assert [rule["ports"] for rule in policy["spec"]["ingress"]] == [
        [{"port": "http", "protocol": "TCP"}]
    ]


def test_service_monitors_only_when_asked(default):
    assert default.all("ServiceMonitor") == []
    monitors = render(VALUE_SETS["service-monitor"]).all("ServiceMonitor")
    ports = {e["port"] for m in monitors for e in m["spec"]["endpoints"]}
    assert ports == {"http", "plugin-metrics", "agent-metrics"}
    assert all(m["metadata"]["labels"]["release"] == "prom" for m in monitors)
    services = default.all("Service")
    named = {p["name"] for s in services for p in s["spec"]["ports"]}
    assert ports <= named


def test_dashboard_configmap_is_picked_up_by_grafana_and_uses_documented_metrics(default):
    config_map = default.one("ConfigMap", f"{FULLNAME}-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["gpushare.json"])
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in (
        "Allocated GPU memory per GPU",
        "Allocated compute per GPU",
        "Pods per GPU",
        "Extender latency",
        "GPU memory used vs cap",
        "Compute used vs share",
        "Time held back",
    ):
        assert wanted in titles
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    used = set(re.findall(r"\bgpushare_[a-z_]+", exprs))
    used = {re.sub(r"_(bucket|sum|count)$", "", m) for m in used}
    documented = set(
        re.findall(r"`(gpushare_[a-z_]+)`", (CHART.parents[1] / "docs" / "metrics.md").read_text())
    )
    assert used and used <= documented, used - documented


def _alert_groups(runbooks: str = RUNBOOKS) -> list[dict[str, Any]]:
    """The plain rules file's groups, its runbook links moved to `runbooks`."""
    text = ALERTS.read_text().replace(RUNBOOKS, runbooks)
    groups: list[dict[str, Any]] = yaml.safe_load(text)["groups"]
    return groups


def test_the_prometheus_rule_is_rendered_only_when_asked(default):
    assert default.all("PrometheusRule") == []
    assert render({"metrics": {"prometheusRule": {"enabled": False}}}).all("PrometheusRule") == []


def test_the_prometheus_rule_holds_the_plain_rules_files_groups_and_the_selectors_labels():
    rule = render(VALUE_SETS["prometheus-rule"]).one("PrometheusRule", f"{FULLNAME}-alerts")
    assert rule["metadata"]["namespace"] == NAMESPACE
    labels = rule["metadata"]["labels"]
    assert labels["release"] == "prom" and labels["team"] == "gpu"
    assert labels["app.kubernetes.io/part-of"] == "gpushare"
    assert rule["spec"] == {"groups": _alert_groups()}
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert len(alerts) == 12 and all(a.startswith("Gpushare") for a in alerts)


def test_the_runbook_links_follow_the_configured_base():
    base = "https://wiki.example.com/gpu/troubleshooting"
    values = {"metrics": {"prometheusRule": {"enabled": True, "runbookBaseUrl": base + "/"}}}
    spec = render(values).one("PrometheusRule")["spec"]
    assert spec == {"groups": _alert_groups(base)}
    urls = [r["annotations"]["runbook_url"] for g in spec["groups"] for r in g["rules"]]
    assert all(u.startswith(base + "#gpushare") for u in urls), urls


def test_the_default_runbook_base_is_the_one_the_plain_file_links():
    with helm.Chart.load(CHART) as chart:
        assert chart.values["metrics"]["prometheusRule"]["runbookBaseUrl"] == RUNBOOKS
    assert ALERTS.read_text().count(RUNBOOKS + "#") == 12


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"enabled": "yes"}, "at '/metrics/prometheusRule/enabled': got string, want boolean"),
        ({"labels": {"release": 1}}, "at '/metrics/prometheusRule/labels/release': got number"),
        ({"additionalLabels": ["team=gpu"]}, "at '/metrics/prometheusRule/additionalLabels'"),
        ({"ruleSelector": {}}, "additional properties 'ruleSelector' not allowed"),
    ],
    ids=lambda v: json.dumps(v),
)
def test_the_schema_refuses_prometheus_rule_values_naming_the_field(values, message):
    with (
        helm.Chart.load(CHART) as chart,
        pytest.raises(helm.HelmValuesError, match=re.escape(message)),
    ):
        chart.validate_schema({"metrics": {"prometheusRule": values}})


def test_the_schema_accepts_the_prometheus_rule_values():
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(VALUE_SETS["prometheus-rule"])
        chart.validate_schema(
            {"metrics": {"prometheusRule": {"runbookBaseUrl": "http://wiki.local/gpushare"}}}
        )


# ----- values and notes (the forms of values, with their messages, and the notes'
# warnings: test_value_messages.py, test_notes.py)


@pytest.mark.parametrize(
    "values",
    [
        {"gpu": {"backend": "cuda"}},
        {"webhok": {"enabled": False}},
        {"webhook": {"failurePolicy": "fail"}},
        {"webhook": {"failurePolicy": "Auto"}},
        {"webhook": {"failurePolicy": True}},
        {"webhook": {"matchConditions": "yes"}},
        {"webhook": {"matchConditions": "true"}},
        {"webhook": {"matchConditions": "Auto"}},
        {"webhook": {"matchConditions": 1}},
        {"webhook": {"namespaceSelector": {"matchLabel": {"a": "b"}}}},
        {"gpu": {"memoryRounding": "nearest"}},
        {"gpu": {"driverRoot": True}},
        {"gpu": {"driverroot": "/run/nvidia/driver"}},
        {"extender": {"weight": 0}},
        {"scheduler": {"extraSchedulerNames": ["x" * 254]}},
        {"scheduler": {"extraSchedulerNames": ["ack-co-scheduler", "ack-co-scheduler"]}},
        {"scheduler": {"extraSchedulerNames": "ack-co-scheduler"}},
        {"isolation": {"memoryAction": "warn"}},
        {"devicePlugin": {"metricPort": 9401}},
    ],
    ids=lambda v: json.dumps(v),
)
def test_schema_rejects_typos_and_bad_values(values):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)


def test_defaults_satisfy_the_schema():
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema({})
        assert chart.values["gpu"]["backend"] == "nvml"
        assert chart.values["webhook"]["failurePolicy"] == "auto"
        assert chart.values["webhook"]["matchConditions"] == "auto"


@pytest.mark.parametrize("names", [[], ["ack-co-scheduler"], ["ack-co-scheduler", "team.gpu"]])
def test_schema_accepts_extra_scheduler_names_a_pod_can_carry(names):
    """The refusals of names (here and in test_value_messages.py) are of the names, not
    of an unknown key."""
    values = {"scheduler": {"name": "gpu", "extraSchedulerNames": names}}
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)
    assert profile_names(render(values)) == ["gpu", *names]


@pytest.mark.parametrize("policy", ["auto", "Fail", "Ignore"])
@pytest.mark.parametrize("match_conditions", ["auto", True, False])
def test_schema_accepts_auto_and_the_explicit_webhook_choices(policy, match_conditions):
    values = {"webhook": {"failurePolicy": policy, "matchConditions": match_conditions}}
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)


def test_notes_say_how_to_label_a_node_and_what_to_put_in_a_pod(default):
    assert "kubectl label node <NODE> ack.node.gpu.schedule=cgpu" in default.notes
    assert "aliyun.com/gpu-mem: 2" in default.notes
    assert "aliyun.com/gpu-core.percentage: 30" in default.notes
    assert "kubectl inspect cgpu" in default.notes


# ----- the chart against the entry points it starts

# The flags each entry point promises (the team's contract); the chart may use no other.
CONTRACT_FLAGS = {
    "gpushare-device-plugin": (
        "gpushare.deviceplugin.main",
        {"--node-name", "--backend", "--mock-gpus", "--gpu-memory-rounding", "--device-plugin-dir",
         "--pod-resources-socket", "--kubeconfig", "--metrics-port", "--log-level", "--dev-root",
         "--interposer-dir"},
    ),
    "gpushare-extender": (
        "gpushare.extender.main",
        {"--scheduler-address", "--host", "--port", "--ops-port", "--url-prefix", "--webhook-port",
         "--tls-cert-file",
         "--tls-key-file", "--scheduler-name", "--extra-scheduler-names", "--default-placement",
         "--max-pods-per-gpu", "--kubeconfig", "--log-level", "--dra-claims"},
    ),
    "gpushare-dra-plugin": (
        "gpushare.draplugin.main",
        {"--node-name", "--kubelet-root", "--cdi-dir", "--state-dir", "--backend", "--mock-gpus",
         "--gpu-memory-rounding", "--dev-root", "--interposer-dir", "--sharing",
         "--metrics-port", "--kubeconfig", "--log-level"},
    ),
    "gpushare-isolation": (
        "gpushare.isolation.main",
        {"--node-name", "--backend", "--mock-gpus", "--gpu-memory-rounding", "--control-dir",
         "--proc-root", "--cgroup-root", "--metrics-port", "--memory-action", "--log-level",
         "--interposer-dir", "--backstop-slack-per-process-mib", "--backstop-slack-max-mib"},
    ),
}  # fmt: skip


CONTRACT_VALUE_SETS = ("defaults", "mock-backend", "dra", "dra-mock-whole-gpus")
"""Between them, every flag the chart passes each entry point (nvml and mock, DRA mode)."""


def chart_commands(values: dict) -> dict[str, set[str]]:
    rendered = render(values)
    pods = [*rendered.all("DaemonSet"), rendered.one("Deployment")]
    used: dict[str, set[str]] = {}
    for pod in pods:
        for c in pod["spec"]["template"]["spec"]["containers"]:
            if c["command"][0] in CONTRACT_FLAGS:
                used.setdefault(c["command"][0], set()).update(flags(c))
    return used


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_chart_passes_only_contract_flags(values):
    for command, used in chart_commands(values).items():
        assert used <= CONTRACT_FLAGS[command][1], (command, used - CONTRACT_FLAGS[command][1])


@pytest.mark.parametrize("command", CONTRACT_FLAGS)
def test_each_entry_point_accepts_the_flags_the_chart_passes(command):
    module, _ = CONTRACT_FLAGS[command]
    if importlib.util.find_spec(module.split(".")[0]) is None or not (
        importlib.util.find_spec(module)
    ):
        pytest.skip(f"{module} is not in this tree yet; the chart follows the contract flags")
    used = set().union(
        *(chart_commands(VALUE_SETS[name]).get(command, set()) for name in CONTRACT_VALUE_SETS)
    )
    assert used, f"no value set starts {command}"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; from {module} import main; sys.exit(main())",
            "--help",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    missing = {f for f in used if f not in result.stdout}
    assert not missing, f"{command} --help does not list {sorted(missing)}"
    scripts = tomllib.loads((CHART.parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get(command) == f"{module}:main"


def test_chart_config_means_what_the_standalone_example_means(default):
    """config/kube-scheduler-config.yaml (the extender's example for running the second
    scheduler by hand) and the chart's rendering must describe the same scheduler."""
    example_path = CHART.parents[1] / "config" / "kube-scheduler-config.yaml"
    if not example_path.exists():
        pytest.skip("config/kube-scheduler-config.yaml is not in this tree yet")
    example = yaml.safe_load(example_path.read_text())
    chart = scheduler_config(default)
    assert example["profiles"] == chart["profiles"]
    assert example["leaderElection"]["resourceName"] != "kube-scheduler"
    [theirs] = example["extenders"]
    [ours] = chart["extenders"]
    for key in ("filterVerb", "prioritizeVerb", "bindVerb", "nodeCacheCapable", "ignorable"):
        assert theirs.get(key) == ours.get(key), key
    assert urlsplit(theirs["urlPrefix"]).path.rstrip("/") == urlsplit(ours["urlPrefix"]).path
    assert {r["name"] for r in theirs["managedResources"]} == {
        r["name"] for r in ours["managedResources"]
    }


def test_the_schema_offers_exactly_the_placement_policies_the_extender_knows():
    from gpushare.placement.policies import POLICIES

    schema = json.loads((CHART / "values.schema.json").read_text())
    offered = schema["properties"]["extender"]["properties"]["defaultPlacement"]["enum"]
    assert sorted(offered) == sorted(POLICIES)


def fit_scoring(rendered) -> dict:
    """NodeResourcesFit's scoringStrategy, the same in every profile."""
    strategies = [
        plugin["args"]["scoringStrategy"]
        for profile in scheduler_config(rendered)["profiles"]
        for plugin in profile["pluginConfig"]
        if plugin["name"] == "NodeResourcesFit"
    ]
    assert len(strategies) == len(scheduler_config(rendered)["profiles"])
    assert all(s == strategies[0] for s in strategies)
    return strategies[0]


def test_the_scheduler_packs_gpu_pods_as_the_simulators_chart_model_does(default):
    """The extender scores 0..10 and many nodes tie: kube-scheduler's NodeResourcesFit
    breaks the ties, and the chart makes it prefer the fuller node (issue 40). The
    simulator's model of the chart's scheduler (kubescheduler.CHART) is what
    docs/placement.md measures: the two must not drift apart."""
    from gpushare.simulator.kubescheduler import CHART

    scoring = fit_scoring(default)
    assert scoring["type"] == CHART.strategy.value == "MostAllocated"
    assert tuple((r["name"], r["weight"]) for r in scoring["resources"]) == CHART.resources
    config = scheduler_config(default)
    assert config["percentageOfNodesToScore"] == CHART.percentage_of_nodes_to_score
    assert config["extenders"][0]["weight"] == CHART.extender_weight


def test_the_scheduler_can_be_told_to_spread_as_kube_scheduler_does_by_default():
    scoring = fit_scoring(
        render({"scheduler": {"scoring": {"strategy": "LeastAllocated", "gpuMemWeight": 7}}})
    )
    assert scoring["type"] == "LeastAllocated"
    assert ("aliyun.com/gpu-mem", 7) in [(r["name"], r["weight"]) for r in scoring["resources"]]


@pytest.mark.parametrize(
    "scoring",
    [{"strategy": "Spread"}, {"gpuMemWeight": 0}, {"gpuMemWeight": 101}, {"weight": 3}],
)
def test_a_scoring_kube_scheduler_would_refuse_is_refused_at_install(scoring):
    with pytest.raises(helm.HelmValuesError, match="schema"):
        render({"scheduler": {"scoring": scoring}})
