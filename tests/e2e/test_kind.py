"""gpushare on a kind cluster: the chart installed, the examples applied, as a user would.

Skipped, with the reason, where Docker (with an engine), kind, kubectl or helm is missing.
"""

import base64
import os
from typing import Any

import pytest

from gpushare import annotation
from gpushare.environment import container_env
from gpushare.inventory import NODE_GPUS_ANNOTATION, decode_gpus
from gpushare.labels import isolation_disabled, node_mode
from gpushare.manifests import pods_from_manifests
from gpushare.objects import Node, Pod
from gpushare.request import parse_pod_request
from gpushare.resources import CORE_PER_GPU, DEFAULT_MAX_PODS_PER_GPU
from gpushare.state import ClusterState
from tests.e2e.conftest import MOCK_GPUS, RELEASE, SYSTEM_NAMESPACE, Deployed, venv_bin
from tests.e2e.kind import ROOT, Kind, run, wait_for
from tests.e2e.workloads import (
    WORKLOAD_LABEL,
    invalid_examples,
    manifests,
    unnamed_scheduler_pod,
    valid_examples,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def workloads(deployed: Deployed) -> list[Pod]:
    """Every valid example plus a pod without a scheduler name, all Running."""
    kind = deployed.kind
    documents = [doc for path in valid_examples() for doc in manifests(path)]
    documents.append(unnamed_scheduler_pod())
    expected = len(pods_from_manifests(documents))
    kind.apply(documents)

    def all_running() -> list[dict[str, Any]] | None:
        pods = kind.get("pods", "-l", WORKLOAD_LABEL)["items"]
        phases = {p["metadata"]["name"]: p["status"].get("phase") for p in pods}
        return pods if len(pods) == expected and set(phases.values()) == {"Running"} else None

    pods = wait_for("every example pod to be Running", all_running, timeout=420)
    return [Pod.model_validate(p) for p in pods]


def cluster_state(kind: Kind) -> tuple[ClusterState, list[Node]]:
    nodes = [Node.model_validate(n) for n in kind.get("nodes")["items"]]
    pods = [Pod.model_validate(p) for p in kind.get("pods", "-A")["items"]]
    state, problems = ClusterState.rebuild(nodes, pods)
    assert problems == []
    return state, nodes


def test_labelled_nodes_advertise_their_mock_gpus(deployed: Deployed):
    count, size = (int(x) for x in MOCK_GPUS.removesuffix("GiB").split("x"))
    for name, mode in deployed.workers.items():
        node = deployed.kind.get("node", name)
        allocatable = node["status"]["allocatable"]
        assert allocatable["aliyun.com/gpu-mem"] == str(count * size)
        assert allocatable["aliyun.com/gpu-count"] == str(count)
        core = allocatable.get("aliyun.com/gpu-core.percentage")
        assert core == (str(count * CORE_PER_GPU) if mode == "core_mem" else None)
        gpus = decode_gpus(node["metadata"]["annotations"][NODE_GPUS_ANNOTATION])
        assert [g.mem for g in gpus] == [size] * count


def test_examples_are_placed_on_gpus_within_the_rules(deployed: Deployed, workloads: list[Pod]):
    state, nodes = cluster_state(deployed.kind)
    modes = {n.name: node_mode(n.metadata.labels) for n in nodes}
    for pod in workloads:
        allocation = annotation.decode(pod)
        assert allocation is not None, f"{pod.key} has no allocation annotation"
        assert allocation.node == pod.spec.node_name
        request = parse_pod_request(pod)
        assert request is not None
        for wanted in request.containers:
            got = allocation.container(wanted.name)
            assert len({s.index for s in got.gpus}) == wanted.gpus, pod.key
            if not wanted.exclusive:
                assert all(s.mem == wanted.mem and s.core == wanted.core for s in got.gpus)
        if request.uses_core:
            assert modes[pod.spec.node_name] == "core_mem", f"{pod.key} needs compute isolation"
    for node in state.nodes.values():
        jobs = {a.job_type for a in node.pods.values() if not a.exclusive_gpus}
        assert len(jobs) <= 1, f"{node.name} mixes {jobs}"
        for gpu in node.inventory.gpus:
            mem, core, pods = node.used(gpu.index)
            assert mem <= gpu.mem and core <= gpu.core and pods <= DEFAULT_MAX_PODS_PER_GPU
            holders = node.pods_on(gpu.index)
            if any(gpu.index in node.pods[key].exclusive_gpus for key in holders):
                assert len(holders) == 1, f"{node.name} GPU {gpu.index} is exclusive"


def test_containers_see_the_contract_environment(deployed: Deployed, workloads: list[Pod]):
    kind = deployed.kind
    nodes = {n["metadata"]["name"]: n for n in kind.get("nodes")["items"]}
    for pod in workloads:
        allocation = annotation.decode(pod)
        assert allocation is not None
        labels = nodes[pod.spec.node_name]["metadata"].get("labels", {})
        disabled = isolation_disabled(node_mode(labels), labels)
        node_annotations = nodes[pod.spec.node_name]["metadata"]["annotations"]
        uuids = {g.index: g.uuid for g in decode_gpus(node_annotations[NODE_GPUS_ANNOTATION])}
        for container in allocation.containers:
            logs = kind.kubectl("logs", pod.metadata.name, "-c", container.name).stdout
            env = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
            expected = container_env(pod, allocation, container, disabled)
            assert {k: env.get(k) for k in expected} == expected, f"{pod.key}/{container.name}"
            visible = env["NVIDIA_VISIBLE_DEVICES"].split(",")
            assert visible == [uuids[s.index] for s in container.gpus]
            assert container.assigned, f"{pod.key}/{container.name} never marked assigned"


def test_webhook_sets_the_scheduler_name(deployed: Deployed, workloads: list[Pod]):
    [pod] = [p for p in workloads if p.metadata.name == "scheduler-name-from-webhook"]
    assert pod.spec.scheduler_name == "gpushare-scheduler"
    assert pod.spec.node_name in deployed.workers


@pytest.mark.parametrize("path", invalid_examples(), ids=lambda p: p.stem)
def test_invalid_examples_are_refused_at_apply_time_naming_the_rule(deployed: Deployed, path):
    refused = deployed.kind.apply(manifests(path), check=False)
    assert refused.returncode != 0, refused.stdout
    assert "denied the request" in refused.stderr
    assert "multiple of 5" in refused.stderr and "[core-multiple-of-5]" in refused.stderr
    for doc in manifests(path):
        missing = deployed.kind.kubectl("get", "pod", doc["metadata"]["name"], check=False)
        assert "NotFound" in missing.stderr


def test_kubectl_inspect_cgpu_shows_the_pods(deployed: Deployed, workloads: list[Pod]):
    env = {**deployed.kind.env, "PATH": f"{venv_bin()}{os.pathsep}{os.environ['PATH']}"}
    details = run(["kubectl", "inspect", "cgpu", "-d"], env=env).stdout
    for pod in workloads:
        assert pod.metadata.name in details
    state, _ = cluster_state(deployed.kind)
    used = sum(n.used(g.index)[0] for n in state.nodes.values() for g in n.inventory.gpus)
    total = sum(n.inventory.total_mem for n in state.nodes.values())
    summary = run(["kubectl", "inspect", "cgpu"], env=env).stdout
    assert summary.splitlines()[-1].startswith(f"{used}/{total} (")
    for worker in deployed.workers:
        assert worker in summary


def test_helm_upgrade_keeps_the_webhook_certificate(deployed: Deployed):
    kind = deployed.kind
    name = f"{RELEASE}-gpushare"

    def ca_bundle() -> bytes:
        hook = kind.get("validatingwebhookconfiguration", name)["webhooks"][0]
        return base64.b64decode(hook["clientConfig"]["caBundle"])

    before = ca_bundle()
    secret = kind.get("secret", "-n", SYSTEM_NAMESPACE, f"{name}-webhook-tls")["data"]
    chart = str(ROOT / "helm" / "gpushare")
    kind.helm("upgrade", RELEASE, chart, "-n", SYSTEM_NAMESPACE, "--reuse-values", "--wait")
    assert ca_bundle() == before == base64.b64decode(secret["ca.crt"])
    after = kind.get("secret", "-n", SYSTEM_NAMESPACE, f"{name}-webhook-tls")["data"]
    assert after == secret
