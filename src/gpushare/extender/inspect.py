"""What /inspect shows: per node and GPU, what is allocated and to which pods."""

from typing import Any

from gpushare.extender.cache import SchedulerCache
from gpushare.extender.nodedetails import NodeDetails


def node_report(cache: SchedulerCache, name: str) -> dict[str, Any] | None:
    details = cache.node_details(name)
    return None if details is None else _node(details)


def cluster_report(cache: SchedulerCache) -> dict[str, Any]:
    details = cache.details()
    return {
        "synced": details.synced,
        "nodes": [_node(node) for node in details.nodes],
        "assumedPods": list(details.assumed),
        "podProblems": dict(sorted(details.pod_problems.items())),
        "waitingPods": list(details.waiting),
    }


def _node(details: NodeDetails) -> dict[str, Any]:
    if details.problem is not None:
        return {"name": details.name, "problem": details.problem}
    gpus = [
        {
            "index": gpu.index,
            "uuid": gpu.uuid,
            "model": gpu.model,
            "healthy": gpu.healthy,
            "memGiB": gpu.mem,
            "allocatedMemGiB": gpu.allocated_mem,
            "corePercent": gpu.core,
            "allocatedCorePercent": gpu.allocated_core,
            "pods": [
                {
                    "pod": pod.key,
                    "memGiB": pod.mem,
                    "corePercent": pod.core,
                    "assumed": pod.assumed,
                }
                for pod in gpu.pods
            ],
        }
        for gpu in details.gpus
    ]
    report: dict[str, Any] = {
        "name": details.name,
        "mode": details.mode,
        "placementPolicy": details.policy,
        "memGiB": details.mem,
        "allocatedMemGiB": sum(gpu.allocated_mem for gpu in details.gpus),
        "gpus": gpus,
    }
    if details.unknown:  # the node takes no GPU pod until these are repaired or gone
        report["unknownAllocations"] = list(details.unknown)
    return report
