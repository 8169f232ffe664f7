"""The node's GPUs as the slice the driver publishes: what the API server accepts and
what the allocator reads from it."""

import pytest

from gpushare.dra.claims import CORES, DRIVER, MEMORY, SHARES
from gpushare.dra.objects import quantity_units
from gpushare.dra.slices import NodeRef, node_slice
from gpushare.dra.validation import (
    ApiGates,
    ApiRelease,
    drop_disabled_fields,
    validate_resource_slice,
)
from gpushare.inventory import Gpu
from gpushare.labels import NodeMode

NODE = NodeRef("gpu-node-1", "5f0c5a8e-0000-4000-8000-000000000001")
GPUS = (Gpu(0, "GPU-a", 15, "Tesla-T4"), Gpu(1, "GPU-b", 15, "Tesla-T4"))


def _devices(mode=NodeMode.CORE_MEM, sharing=True, gpus=GPUS):
    return {d.name: d for d in node_slice(NODE, gpus, mode, sharing).spec.devices}


@pytest.mark.parametrize("mode", [*NodeMode, None])
@pytest.mark.parametrize("sharing", [True, False])
def test_the_api_server_accepts_the_slice(mode, sharing):
    published = node_slice(NODE, GPUS, mode, sharing)
    assert published.metadata.generate_name == f"{NODE.name}-{DRIVER}-"
    named = published.model_copy(
        update={"metadata": published.metadata.model_copy(update={"name": "n-1"})}
    )
    assert validate_resource_slice(named) == []


def test_one_pool_per_node_one_device_per_gpu_owned_by_the_node():
    published = node_slice(NODE, GPUS, NodeMode.CGPU, True, generation=3)
    spec = published.spec
    assert (spec.driver, spec.node_name, spec.pool.name) == (DRIVER, NODE.name, NODE.name)
    assert (spec.pool.generation, spec.pool.resource_slice_count) == (3, 1)
    assert [d.name for d in spec.devices] == ["gpu-0", "gpu-1"]
    (owner,) = published.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller) == (
        "Node",
        NODE.name,
        NODE.uid,
        True,
    )


def test_devices_carry_the_gpus_identity_and_the_nodes_mode():
    device = _devices(NodeMode.CGPU)["gpu-1"]
    assert {k: a.value for k, a in device.attributes.items()} == {
        "uuid": "GPU-b",
        "index": 1,
        "mode": "cgpu",
        "model": "Tesla-T4",
    }


def test_a_sharing_device_encodes_the_resource_models_rules():
    device = _devices(NodeMode.CORE_MEM)["gpu-0"]
    assert device.allow_multiple_allocations is True
    memory = device.capacity[MEMORY]
    assert quantity_units(memory.value) == 15 * 1024**3
    assert memory.request_policy.default == "15Gi"
    assert (memory.request_policy.valid_range.min, memory.request_policy.valid_range.step) == (
        "1Gi",
        "1Gi",
    )
    cores = device.capacity[CORES].request_policy
    assert (
        cores.default,
        cores.valid_range.min,
        cores.valid_range.max,
        cores.valid_range.step,
    ) == (
        "0",
        "0",
        "100",
        "5",
    )
    shares = device.capacity[SHARES]
    assert (shares.value, shares.request_policy.default, shares.request_policy.valid_values) == (
        "20",
        "1",
        ["1", "20"],
    )


@pytest.mark.parametrize("mode", [NodeMode.SHARE, NodeMode.CGPU])
def test_compute_is_offered_only_where_the_node_isolates_it(mode):
    assert CORES not in _devices(mode)["gpu-0"].capacity


@pytest.mark.parametrize("mode, sharing", [(NodeMode.CGPU, False), (None, True)])
def test_without_sharing_each_device_is_a_whole_gpu(mode, sharing):
    device = _devices(mode, sharing)["gpu-0"]
    assert not device.allow_multiple_allocations
    assert all(c.request_policy is None for c in device.capacity.values())
    # A whole-GPU claim asks every share: the capacity must be there for it to match.
    assert device.capacity[SHARES].value == "20"


def test_an_unhealthy_gpu_is_not_published():
    gpus = (GPUS[0], Gpu(1, "GPU-b", 15, healthy=False))
    assert list(_devices(gpus=gpus)) == ["gpu-0"]


def test_an_api_server_without_consumable_capacity_drops_the_sharing_silently():
    # What the driver must notice after its write (docs/dra.md#what-each-release-needs).
    published = node_slice(NODE, GPUS, NodeMode.CORE_MEM, True)
    stored = drop_disabled_fields(published, ApiGates.of(ApiRelease.V1_35))
    device = stored.spec.devices[0]
    assert not device.allow_multiple_allocations
    assert device.capacity[MEMORY].request_policy is None


def test_a_first_slice_is_generation_zero_owned_through_the_core_api():
    published = node_slice(NODE, GPUS, NodeMode.CGPU, True)
    assert published.spec.pool.generation == 0
    (owner,) = published.metadata.owner_references
    assert owner.api_version == "v1"


@pytest.mark.parametrize("sharing", [True, False])
def test_a_node_without_a_sharing_mode_publishes_exclusive_devices_with_their_identity(sharing):
    device = _devices(None, sharing)["gpu-0"]
    assert {k: a.value for k, a in device.attributes.items()} == {
        "uuid": "GPU-a",
        "index": 0,
        "mode": "exclusive",
        "model": "Tesla-T4",
    }


def test_a_model_name_is_cut_to_the_attribute_limit():
    long = "NVIDIA-" + "X" * 70
    (device,) = node_slice(NODE, (Gpu(0, "GPU-a", 15, long),), NodeMode.CGPU, True).spec.devices
    assert device.attributes["model"].value == long[:64]
