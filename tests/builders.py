"""Small builders that keep tests about behaviour rather than about YAML."""

from collections.abc import Mapping
from datetime import UTC, datetime

from gpushare.cluster.memory import gpu_node
from gpushare.inventory import Gpu, NodeGpus, parse_layout
from gpushare.labels import NodeMode
from gpushare.objects import Node, Pod
from gpushare.request import PodRequest, parse_pod_request
from gpushare.state import NodeState

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def pod(
    name: str = "p",
    mem: int | str | None = None,
    core: int | str | None = None,
    count: int | str | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    containers: list[dict] | None = None,
    init_containers: list[dict] | None = None,
    namespace: str = "default",
    node: str | None = None,
    annotations: Mapping[str, str] | None = None,
    priority: int | None = None,
) -> Pod:
    """A pod with one container asking for (mem, core, count), or explicit containers."""
    if containers is None:
        containers = [container("main", mem, core, count)]
    return Pod.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{name}",
                "labels": dict(labels or {}),
                "annotations": dict(annotations or {}),
            },
            "spec": {
                "containers": containers,
                "initContainers": init_containers or [],
                "nodeName": node,
                "priority": priority,
            },
        }
    )


def being_deleted(deleted: Pod) -> Pod:
    """The pod as the API shows it once a graceful delete began (deletionTimestamp set)."""
    meta = deleted.metadata.model_copy(update={"deletion_timestamp": T0})
    return deleted.model_copy(update={"metadata": meta})


def container(
    name: str,
    mem: int | str | None = None,
    core: int | str | None = None,
    count: int | str | None = None,
    *,
    requests: Mapping[str, str] | None = None,
    restart_policy: str | None = None,
) -> dict:
    limits = {}
    if mem is not None:
        limits["aliyun.com/gpu-mem"] = str(mem)
    if core is not None:
        limits["aliyun.com/gpu-core.percentage"] = str(core)
    if count is not None:
        limits["aliyun.com/gpu-count"] = str(count)
    spec: dict = {"name": name, "resources": {"limits": limits, "requests": dict(requests or {})}}
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    return spec


def request(**kwargs) -> PodRequest:
    parsed = parse_pod_request(pod(**kwargs))
    assert parsed is not None
    return parsed


def inventory(
    layout: str = "2x16GiB",
    node: str = "n1",
    mode: NodeMode | str | None = NodeMode.CGPU,
    max_pods_per_gpu: int = 20,
    unhealthy: tuple[int, ...] = (),
) -> NodeGpus:
    gpus = tuple(
        Gpu(g.index, g.uuid, g.mem, g.model, g.core, g.index not in unhealthy)
        for g in parse_layout(layout, node)
    )
    return NodeGpus(node, NodeMode(mode) if mode else None, gpus, max_pods_per_gpu)


def node_state(layout: str = "2x16GiB", **kwargs) -> NodeState:
    return NodeState(inventory(layout, **kwargs))


def node(name: str, layout: str = "2x16GiB", mode: str | None = "cgpu", **labels: str) -> Node:
    return gpu_node(name, parse_layout(layout, name), mode=mode, labels=labels)
