"""The JSON of valid resource.k8s.io/v1 objects as docs/dra.md#the-slice names them, and a way
to change one field of it, so a test reads as the one thing it breaks."""

import copy
from collections.abc import Callable
from typing import Any

DRIVER = "gpu.gpushare.io"
GONE = object()
"""A value for `at` that removes the field."""


def gpu(name: str = "gpu-0", shared: bool = True, index: int = 0) -> dict[str, Any]:
    """A GPU as the slice publisher writes it: a sharing node's, or (shared=False) an
    exclusive one's."""
    device: dict[str, Any] = {
        "name": name,
        "attributes": {
            "uuid": {"string": f"GPU-{name}"},
            "model": {"string": "NVIDIA A10"},
            "index": {"int": index},
            "mode": {"string": "cgpu" if shared else "exclusive"},
        },
        "capacity": {"memory": {"value": "16Gi"}},
    }
    if shared:
        device["allowMultipleAllocations"] = True
        device["capacity"] = {
            "memory": {
                "value": "16Gi",
                "requestPolicy": {"default": "16Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
            },
            "cores": {
                "value": "100",
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": "100", "step": "5"},
                },
            },
            "shares": {
                "value": "20",
                "requestPolicy": {"default": "1", "validValues": ["1", "20"]},
            },
        }
    return device


def slice_doc(
    name: str = "n1-gpu.gpushare.io-abcde",
    node: str = "n1",
    devices: list[dict[str, Any]] | None = None,
    driver: str = DRIVER,
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": devices if devices is not None else [gpu("gpu-0"), gpu("gpu-1", index=1)],
        },
    }


def exact(memory: str = "4Gi", count: int = 1) -> dict[str, Any]:
    return {
        "deviceClassName": DRIVER,
        "count": count,
        "capacity": {"requests": {"memory": memory}},
    }


def claim_doc(name: str = "c", namespace: str = "default", requests: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [{"name": f"c{i}", "exactly": exact()} for i in range(requests)]
            }
        },
    }


def result(request: str = "c0", device: str = "gpu-0", share: str = "s-1") -> dict[str, Any]:
    return {
        "request": request,
        "driver": DRIVER,
        "pool": "n1",
        "device": device,
        "shareID": share,
        "consumedCapacity": {"memory": "4Gi", "cores": "0", "shares": "1"},
    }


def at(path: str, value: Any, key: str | None = None) -> Callable[[dict[str, Any]], None]:
    """A change of one field, by its dotted path (list items by index), or of the entry
    `key` of the map at `path` (a key with dots in it); GONE removes it. Maps on the way
    that are missing are made."""

    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".") if key is None else [*path.split("."), key]
        node: Any = doc
        for step in parents:
            node = node[int(step)] if isinstance(node, list) else node.setdefault(step, {})
        final: Any = int(last) if isinstance(node, list) else last
        if value is GONE:
            del node[final]
        else:
            node[final] = copy.deepcopy(value)

    return change


def changed(doc: dict[str, Any], *changes: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    for change in changes:
        change(doc)
    return doc
