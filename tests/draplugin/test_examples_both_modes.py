"""Every example in examples/ served the same way in both modes: a pod placed on the
same GPUs gets, in DRA mode (webhook rewrite → claim → allocation → the driver's
Prepare → CDI), exactly the environment the device plugin's Allocate gives it, and the
CUDA interposer where its memory is capped."""

from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from gpushare.allocation import PodAllocation
from gpushare.environment import CUDA_REGION, container_env, isolated_at_the_call
from gpushare.inventory import NodeGpus
from gpushare.labels import NodeMode
from gpushare.manifests import pods_from_manifests
from gpushare.placement.fit import Placement, evaluate, to_allocation
from gpushare.placement.policies import POLICIES
from gpushare.request import parse_pod_request
from gpushare.state import NodeState
from tests.draplugin.driverrig import NODE, DriverRig, shared, whole

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def _device_plugin_allocation(state: NodeState, pod, inventory: NodeGpus) -> PodAllocation:
    """Where the extender puts the pod, as the device plugin records it."""
    request = parse_pod_request(pod)
    assert request is not None
    placement = evaluate(state.view(), request, POLICIES["binpack"]())
    assert isinstance(placement, Placement), placement
    allocation = to_allocation(request, placement.assignment, inventory, datetime.now(UTC))
    state.add(pod.key, allocation)
    return allocation


def _results(allocation: PodAllocation):
    return [
        whole(c.name, f"gpu-{s.index}")
        if c.exclusive
        else shared(c.name, f"gpu-{s.index}", s.mem, s.core)
        for c in allocation.containers
        for s in c.gpus
    ]


def test_the_examples_are_there():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_an_example_gets_the_device_plugins_environment_in_dra_mode(path, short_tmp):
    pods = pods_from_manifests(yaml.safe_load_all(path.read_text()))
    assert pods
    rig = DriverRig(short_tmp, mode="core_mem", layout="4x16GiB").start()
    try:
        gpus = tuple(p.gpu for p in rig.backend.discover())
        inventory = NodeGpus(NODE, NodeMode.CORE_MEM, gpus)
        state = NodeState(inventory)
        for number, pod in enumerate(pods):
            pod = pod.model_copy(
                update={
                    "metadata": pod.metadata.model_copy(
                        update={
                            "name": pod.metadata.name or f"{path.stem}-{number}",
                            "namespace": pod.metadata.namespace or "default",
                            "uid": f"{number:08d}-0000-4000-8000-000000000000",
                        }
                    )
                }
            )
            allocation = _device_plugin_allocation(state, pod, inventory)
            placed = rig.place(pod, _results(allocation))
            rig.kubelet.prepare(placed.pod.metadata.uid, [placed.pod_claim])
            for container in allocation.containers:
                expected = container_env(pod, allocation, container, isolation_disabled=False)
                got = rig.kubelet.container_edits(
                    placed.pod.metadata.uid, placed.claim.metadata.uid, container.name
                ).env
                capped = isolated_at_the_call(pod, container, expected)
                assert (CUDA_REGION in got) == capped, container.name
                got.pop(CUDA_REGION, None)
                assert got == expected, f"{pod.key} container {container.name}"
    finally:
        rig.stop()
