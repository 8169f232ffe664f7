"""Pods from the YAML a user applies: a Pod, or the pod template of a workload."""

from collections.abc import Iterable, Mapping
from typing import Any

from gpushare.objects import Pod

_WORKLOADS = {"Job", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"}


def pods_from_manifests(documents: Iterable[Mapping[str, Any] | None]) -> list[Pod]:
    """The pods the manifests would create: a Job's parallelism, a Deployment's
    replicas, one pod otherwise. Objects that make no pods are skipped."""
    pods: list[Pod] = []
    for doc in documents:
        if not doc:
            continue
        kind = doc.get("kind")
        if kind == "Pod":
            pods.append(Pod.model_validate(doc))
        elif kind in _WORKLOADS:
            pods.extend(_template_pods(doc))
    return pods


def _template_pods(doc: Mapping[str, Any]) -> list[Pod]:
    meta = doc.get("metadata", {})
    spec = doc.get("spec", {})
    template = spec.get("template", {})
    # Kubernetes' default is one pod; 0 (a paused Job, a scaled-down Deployment) is none.
    count = spec.get("parallelism", spec.get("replicas"))
    count = 1 if count is None else int(count)
    pods = []
    for i in range(count):
        pod_meta = dict(template.get("metadata", {}))
        pod_meta["name"] = f"{meta.get('name', 'pod')}-{i}"
        pod_meta["namespace"] = meta.get("namespace", "default")
        pods.append(Pod.model_validate({"metadata": pod_meta, "spec": template.get("spec", {})}))
    return pods
