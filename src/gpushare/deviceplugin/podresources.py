"""The kubelet's PodResources API v1 (List): which container holds which device IDs.

The kubelet may split one container's devices of a resource over several
entries (per device, per NUMA node), so entries are grouped by resource and
their IDs merged (docs/contracts.md#podresources-api-v1). Pods are named by namespace and name
only; ordinary init containers are not listed.
"""

from collections.abc import Collection
from pathlib import Path
from typing import Final

import grpc

from gpushare.kubeletapi.podresources.v1 import api_pb2 as pr
from gpushare.kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc

Holder = tuple[str, str]
"""(namespace/name of the pod, container name)."""
Holdings = dict[Holder, dict[str, frozenset[str]]]

TIMEOUT: Final = 5.0


def list_pod_resources(socket: Path, timeout: float = TIMEOUT) -> pr.ListPodResourcesResponse:
    """Raises grpc.RpcError (RESOURCE_EXHAUSTED when the kubelet rate-limits)."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        response: pr.ListPodResourcesResponse = pr_grpc.PodResourcesListerStub(channel).List(
            pr.ListPodResourcesRequest(), timeout=timeout
        )
    return response


def holdings(response: pr.ListPodResourcesResponse, resources: Collection[str]) -> Holdings:
    """Device IDs per container and resource, for `resources` only."""
    found: dict[Holder, dict[str, set[str]]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name not in resources or not devices.device_ids:
                    continue
                holder = (f"{pod.namespace}/{pod.name}", container.name)
                ids = found.setdefault(holder, {}).setdefault(devices.resource_name, set())
                ids.update(devices.device_ids)
    return {
        holder: {resource: frozenset(ids) for resource, ids in per_resource.items()}
        for holder, per_resource in found.items()
    }
