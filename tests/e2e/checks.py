"""What a user would check on any cluster running gpushare, whichever way it was made.

Each check reads the cluster through a `KubectlTarget` only, so the kind suite and
the local real-cluster tier assert the very same behaviour.
"""

from typing import Any

from gpushare import annotation
from gpushare.environment import container_env
from gpushare.inventory import NODE_GPUS_ANNOTATION, decode_gpus
from gpushare.labels import isolation_disabled, node_mode
from gpushare.objects import Node, Pod
from gpushare.request import parse_pod_request
from gpushare.resources import DEFAULT_MAX_PODS_PER_GPU
from gpushare.state import ClusterState
from tests.e2e.kube import KubectlTarget


def cluster_state(target: KubectlTarget) -> tuple[ClusterState, list[Node]]:
    """The allocations rebuilt from the API's nodes and pod annotations alone."""
    nodes = [Node.model_validate(n) for n in target.get("nodes")["items"]]
    pods = [Pod.model_validate(p) for p in target.get("pods", "-A")["items"]]
    state, problems = ClusterState.rebuild(nodes, pods)
    assert problems == []
    return state, nodes


def assert_within_capacity(state: ClusterState) -> None:
    """No GPU over its memory, its 100% of compute or its pod limit; exclusive GPUs alone;
    no node mixing memory-only and memory-plus-compute jobs."""
    for node in state.nodes.values():
        jobs = {a.job_type for a in node.pods.values() if not a.exclusive_gpus}
        assert len(jobs) <= 1, f"{node.name} mixes {jobs}"
        for gpu in node.inventory.gpus:
            mem, core, pods = node.used(gpu.index)
            where = f"{node.name} GPU {gpu.index}"
            assert mem <= gpu.mem, f"{where}: {mem} GiB of {gpu.mem} allocated"
            assert core <= gpu.core, f"{where}: {core} percent of {gpu.core} allocated"
            assert pods <= DEFAULT_MAX_PODS_PER_GPU, f"{where}: {pods} pods"
            holders = node.pods_on(gpu.index)
            if any(gpu.index in node.pods[key].exclusive_gpus for key in holders):
                assert len(holders) == 1, f"{where} is exclusive but shared by {holders}"


def assert_placed_as_asked(pod: Pod) -> None:
    """The annotation gives each asking container what it asked, on its node."""
    allocation = annotation.decode(pod)
    assert allocation is not None, f"{pod.key} has no allocation annotation"
    assert allocation.node == pod.spec.node_name
    request = parse_pod_request(pod)
    assert request is not None
    allocated = {c.name: c for c in allocation.containers}
    for wanted in request.containers:
        got = allocated[wanted.name]
        assert len({s.index for s in got.gpus}) == wanted.gpus, pod.key
        if not wanted.exclusive:
            assert all(s.mem == wanted.mem and s.core == wanted.core for s in got.gpus)


def env_of(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line)


def assert_env_matches_annotation(target: KubectlTarget, pods: list[dict[str, Any]]) -> int:
    """Every container that holds a slice (init containers included) printed exactly the
    environment its allocation annotation implies, with the node's GPU UUIDs, and was
    marked assigned. Returns how many containers were checked."""
    nodes = {n["metadata"]["name"]: n for n in target.get("nodes")["items"]}
    checked = 0
    for raw in pods:
        pod = Pod.model_validate(raw)
        allocation = annotation.decode(pod)
        assert allocation is not None, f"{pod.key} has no allocation annotation"
        labels = nodes[pod.spec.node_name]["metadata"].get("labels", {})
        disabled = isolation_disabled(node_mode(labels), labels)
        node_annotations = nodes[pod.spec.node_name]["metadata"]["annotations"]
        uuids = {g.index: g.uuid for g in decode_gpus(node_annotations[NODE_GPUS_ANNOTATION])}
        for container in allocation.containers:
            env = env_of(target.container_log(raw, container.name))
            expected = container_env(pod, allocation, container, disabled)
            where = f"{pod.key}/{container.name}"
            assert {k: env.get(k) for k in expected} == expected, where
            visible = env["NVIDIA_VISIBLE_DEVICES"].split(",")
            assert visible == [uuids[s.index] for s in container.gpus], where
            assert container.assigned, f"{where} never marked assigned"
            checked += 1
    return checked


def admission_failures(pods: list[dict[str, Any]]) -> list[str]:
    """Pods the kubelet rejected, each as `name: reason message`."""
    return [
        f"{p['metadata']['name']}: {p['status'].get('reason')} {p['status'].get('message')}"
        for p in pods
        if p["status"].get("phase") == "Failed"
    ]
