"""gpushare on a kind cluster: the chart installed, the examples applied, as a user would.

Skipped, with the reason, where Docker (with an engine), kind, kubectl or helm is missing.
"""

import base64
import os
from typing import Any

import pytest

from gpushare.inventory import NODE_GPUS_ANNOTATION, decode_gpus
from gpushare.labels import node_mode
from gpushare.manifests import pods_from_manifests
from gpushare.objects import Pod
from gpushare.request import parse_pod_request
from gpushare.resources import CORE_PER_GPU
from tests.e2e.checks import (
    assert_env_matches_annotation,
    assert_placed_as_asked,
    assert_within_capacity,
    cluster_state,
)
from tests.e2e.conftest import MOCK_GPUS, RELEASE, SYSTEM_NAMESPACE, Deployed, venv_bin
from tests.e2e.kube import ROOT, run, wait_for
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
        assert_placed_as_asked(pod)
        request = parse_pod_request(pod)
        if request is not None and request.uses_core:
            assert modes[pod.spec.node_name] == "core_mem", f"{pod.key} needs compute isolation"
    assert_within_capacity(state)


def test_containers_see_the_contract_environment(deployed: Deployed, workloads: list[Pod]):
    pods = deployed.kind.get("pods", "-l", WORKLOAD_LABEL)["items"]
    assert assert_env_matches_annotation(deployed.kind, pods) >= len(workloads)


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
