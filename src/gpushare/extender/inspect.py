"""What /inspect shows: per node and GPU, what is allocated and to which pods."""

from typing import Any

from gpushare.extender.cache import SchedulerCache


def node_report(cache: SchedulerCache, name: str) -> dict[str, Any] | None:
    with cache.lock:
        state = cache.state.nodes.get(name)
        if state is None:
            problem = cache.node_problems.get(name)
            return None if problem is None else {"name": name, "problem": problem}
        charges = {key: allocation.charges() for key, allocation in state.pods.items()}
        gpus = []
        for gpu in state.inventory.gpus:
            mem, core, _ = state.used(gpu.index)
            pods = [
                {
                    "pod": key,
                    "memGiB": charges[key][gpu.index][0],
                    "corePercent": charges[key][gpu.index][1],
                    "assumed": key in cache.assumed,
                }
                for key in sorted(state.pods_on(gpu.index))
            ]
            gpus.append(
                {
                    "index": gpu.index,
                    "uuid": gpu.uuid,
                    "model": gpu.model,
                    "healthy": gpu.healthy,
                    "memGiB": gpu.mem,
                    "allocatedMemGiB": mem,
                    "corePercent": gpu.core,
                    "allocatedCorePercent": core,
                    "pods": pods,
                }
            )
        return {
            "name": name,
            "mode": state.inventory.mode.value if state.inventory.mode else None,
            "placementPolicy": cache.node_policies.get(name, cache.default_policy),
            "memGiB": state.inventory.total_mem,
            "allocatedMemGiB": sum(g["allocatedMemGiB"] for g in gpus),
            "gpus": gpus,
        }


def cluster_report(cache: SchedulerCache) -> dict[str, Any]:
    with cache.lock:
        names = sorted(set(cache.state.nodes) | set(cache.node_problems))
        nodes = [node_report(cache, name) for name in names]
        return {
            "synced": cache.synced,
            "nodes": [n for n in nodes if n is not None and (n.get("gpus") or "problem" in n)],
            "assumedPods": sorted(cache.assumed),
            "podProblems": dict(sorted(cache.pod_problems.items())),
        }
