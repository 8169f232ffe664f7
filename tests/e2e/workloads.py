"""The repository's examples/, made runnable on kind nodes whose GPUs are mock ones.

Each example keeps its resources, labels and scheduler name; only the containers
change: they run the gpushare image (already loaded into kind, so nothing is
pulled), print their environment and sleep, since there is no GPU to use.
"""

import copy
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.kind import ROOT

IMAGE = "gpushare/gpushare:e2e"
WORKLOAD_LABEL = "gpushare-e2e=true"
EXAMPLES = ROOT / "examples"

_APP = ["sh", "-c", "env | sort; exec sleep 3600"]
_INIT = ["sh", "-c", "env | sort"]
_WORKLOADS = {"Job", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"}


def runnable(document: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(document)
    template = doc["spec"]["template"] if doc["kind"] in _WORKLOADS else doc
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    key, value = WORKLOAD_LABEL.split("=")
    labels[key] = value
    spec = template["spec"]
    for group, command in (("initContainers", _INIT), ("containers", _APP)):
        for container in spec.get(group, []):
            container.update(image=IMAGE, imagePullPolicy="Never", command=command)
            container.pop("args", None)
    return doc


def manifests(path: Path) -> list[dict[str, Any]]:
    return [runnable(doc) for doc in yaml.safe_load_all(path.read_text()) if doc]


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
