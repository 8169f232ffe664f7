"""The repository's examples/, made runnable on nodes whose GPUs are mock ones.

Each example keeps its resources, labels and scheduler name; only the containers
change: they run a local image (the gpushare image loaded into kind, or the local
cluster's busybox), print their environment and wait, since there is no GPU to
use. The wait ends at SIGTERM, so a deleted pod is gone in about a second.
"""

import copy
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.kube import ROOT

IMAGE = "gpushare/gpushare:e2e"
"""The kind suite's image; the local real cluster has only `local/busybox:1`."""
BUSYBOX = "local/busybox:1"
WORKLOAD_LABEL = "gpushare-e2e=true"
EXAMPLES = ROOT / "examples"

_APP = ["sh", "-c", 'trap "exit 0" TERM; env | sort; while :; do sleep 1; done']
_INIT = ["sh", "-c", "env | sort"]
_WORKLOADS = {"Job", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"}


def runnable(
    document: dict[str, Any], image: str = IMAGE, pull_policy: str = "Never"
) -> dict[str, Any]:
    doc = copy.deepcopy(document)
    template = doc["spec"]["template"] if doc["kind"] in _WORKLOADS else doc
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    key, value = WORKLOAD_LABEL.split("=")
    labels[key] = value
    spec = template["spec"]
    for group, command in (("initContainers", _INIT), ("containers", _APP)):
        for container in spec.get(group, []):
            container.update(image=image, imagePullPolicy=pull_policy, command=command)
            container.pop("args", None)
    return doc


def manifests(path: Path, image: str = IMAGE, pull_policy: str = "Never") -> list[dict[str, Any]]:
    return [
        runnable(doc, image, pull_policy) for doc in yaml.safe_load_all(path.read_text()) if doc
    ]


def valid_examples() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def invalid_examples() -> list[Path]:
    return sorted((EXAMPLES / "invalid").glob("*.yaml"))


def unnamed_scheduler_pod() -> dict[str, Any]:
    """A pod that asks for GPU memory but leaves spec.schedulerName to the webhook."""
    return runnable(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "scheduler-name-from-webhook"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "app", "resources": {"limits": {"aliyun.com/gpu-mem": 1}}}],
            },
        }
    )


def gpu_pod(
    name: str,
    mem: int,
    core: int | None = None,
    *,
    image: str = IMAGE,
    pull_policy: str = "Never",
    priority_class: str | None = None,
    grace_s: int | None = None,
    ignore_sigterm: bool = False,
) -> dict[str, Any]:
    """One pod asking `mem` GiB (and `core` percent) of one GPU from our scheduler.

    `ignore_sigterm` makes it a trainer that checkpoints: it holds its GPU for the
    whole grace period after deletion."""
    limits: dict[str, int] = {"aliyun.com/gpu-mem": mem}
    if core is not None:
        limits["aliyun.com/gpu-core.percentage"] = core
    spec: dict[str, Any] = {
        "schedulerName": "gpushare-scheduler",
        "restartPolicy": "Never",
        "containers": [{"name": "app", "resources": {"limits": limits}}],
    }
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if grace_s is not None:
        spec["terminationGracePeriodSeconds"] = grace_s
    pod = runnable(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec},
        image,
        pull_policy,
    )
    if ignore_sigterm:
        pod["spec"]["containers"][0]["command"] = [
            "sh", "-c", 'trap "" TERM; env | sort; while :; do sleep 1; done'
        ]  # fmt: skip
    return pod


def busybox_pod(name: str, mem: int, core: int | None = None, **kwargs: Any) -> dict[str, Any]:
    """`gpu_pod` for the local real cluster, whose only image is busybox."""
    return gpu_pod(name, mem, core, image=BUSYBOX, pull_policy="IfNotPresent", **kwargs)


def gpu_job(name: str, pod: dict[str, Any], count: int, **pod_spec: Any) -> dict[str, Any]:
    """A Job running `count` copies of `pod` at once (extra `pod_spec` fields merged in);
    pods the kubelet rejects are replaced, up to twice `count`."""
    labels = pod["metadata"]["labels"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "parallelism": count,
            "completions": count,
            "backoffLimit": 2 * count,
            "template": {"metadata": {"labels": labels}, "spec": {**pod["spec"], **pod_spec}},
        },
    }
