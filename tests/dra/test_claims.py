"""ACK requests as claims (what the webhook writes) and a claim's allocation as our
allocation record (what Prepare builds the container's environment from)."""

from datetime import UTC, datetime

import pytest

from gpushare.dra.claims import (
    CORES,
    DEVICE_CLASS,
    DRIVER,
    GIB,
    MEMORY,
    SHARED_SELECTOR,
    SHARES,
    AllocationError,
    DeviceResult,
    claim_requests,
    container_places,
    device_class,
    device_index,
    pod_allocation,
    template_name,
    template_spec,
)
from gpushare.inventory import Gpu
from gpushare.request import ContainerRole, parse_pod_request
from tests.builders import pod

GPUS = {0: Gpu(0, "GPU-a", 15), 1: Gpu(1, "GPU-b", 15)}
AT = datetime(2026, 11, 28, tzinfo=UTC)


def _requests(labels=None, **limits):
    request = parse_pod_request(pod("p", labels=labels, **limits))
    assert request is not None
    return claim_requests(request)


def test_a_memory_request_asks_the_memory_of_one_shared_gpu():
    (request,) = _requests(mem=4)
    assert request.count == 1
    assert dict(request.capacity) == {MEMORY: "4Gi"}
    manifest = request.manifest()
    assert manifest["exactly"]["deviceClassName"] == DEVICE_CLASS
    assert manifest["exactly"]["selectors"] == [{"cel": {"expression": SHARED_SELECTOR}}]


def test_a_compute_share_is_asked_as_cores():
    (request,) = _requests(mem=4, core=30)
    assert dict(request.capacity) == {MEMORY: "4Gi", CORES: "30"}


def test_a_split_label_asks_its_share_of_the_memory_on_each_of_its_gpus():
    # ACK: gpu-mem 8 with the pod label gpu-count 2 is 4 GiB on each of 2 GPUs.
    (request,) = _requests(labels={"aliyun.com/gpu-count": "2"}, mem=8)
    assert (request.count, dict(request.capacity)) == (2, {MEMORY: "4Gi"})


def test_whole_gpus_ask_every_share_and_no_shared_selector():
    (request,) = _requests(count=2)
    assert (request.count, dict(request.capacity), request.shared) == (2, {SHARES: "20"}, False)
    assert "selectors" not in request.manifest()["exactly"]


def test_the_template_is_named_for_its_content():
    four, four_again, five = _requests(mem=4), _requests(mem=4), _requests(mem=5)
    assert template_name(four) == template_name(four_again)
    assert template_name(four) != template_name(five)
    assert template_name(four).startswith("gpushare-") and len(template_name(four)) == 19
    assert template_spec(four)["spec"]["devices"]["requests"][0]["name"] == four[0].name


@pytest.mark.parametrize("name, index", [("gpu-0", 0), ("gpu-12", 12)])
def test_device_names_carry_the_gpu_index(name, index):
    assert device_index(name) == index


@pytest.mark.parametrize("name", ["gpu-", "gpu-01", "gpu-x", "mig-1", "gpu1"])
def test_a_device_name_this_driver_never_publishes_is_refused(name):
    with pytest.raises(AllocationError, match=name):
        device_index(name)


def _result(request="c", device="gpu-1", share="s1", memory=4 * GIB, cores=30, shares=1):
    return DeviceResult(request, device, share, memory, cores, shares)


def test_a_shared_result_becomes_the_slice_the_device_plugin_would_record():
    allocation = pod_allocation([_result()], GPUS, "node-a", AT, lambda r: ["trainer"])
    (container,) = allocation.containers
    assert container.name == "trainer" and not container.exclusive
    (gpu,) = container.gpus
    assert (gpu.index, gpu.uuid, gpu.mem, gpu.core, gpu.gpu_mem) == (1, "GPU-b", 4, 30, 15)
    assert allocation.total_mem == 4 and allocation.node == "node-a"


def test_memory_is_rounded_up_to_whole_gib():
    allocation = pod_allocation([_result(memory=4 * GIB + 1)], GPUS, "n", AT, lambda r: ["c"])
    assert allocation.containers[0].gpus[0].mem == 5


def test_a_result_without_share_id_holds_the_whole_gpu():
    allocation = pod_allocation(
        [_result(share=None, memory=None, cores=None, shares=None)], GPUS, "n", AT, lambda r: ["c"]
    )
    (container,) = allocation.containers
    assert container.exclusive and container.gpus[0].mem == 15


def test_results_of_one_request_are_one_container_on_several_gpus():
    results = [_result(device="gpu-0", share="s1"), _result(device="gpu-1", share="s2")]
    allocation = pod_allocation(results, GPUS, "n", AT, lambda r: ["c"])
    assert [g.index for g in allocation.containers[0].gpus] == [0, 1]
    assert allocation.total_mem == 8


def test_a_request_used_by_several_containers_keeps_its_own_name():
    allocation = pod_allocation([_result(request="shared")], GPUS, "n", AT, lambda r: ["a", "b"])
    assert allocation.containers[0].name == "shared"


def test_a_device_the_node_lacks_is_refused():
    with pytest.raises(AllocationError, match="GPU 7 absent"):
        pod_allocation([_result(device="gpu-7")], GPUS, "n", AT, lambda r: ["c"])


def test_more_memory_than_the_gpu_has_is_refused():
    with pytest.raises(AllocationError, match="16 GiB"):
        pod_allocation([_result(memory=16 * GIB)], GPUS, "n", AT, lambda r: ["c"])


def test_a_request_mixing_whole_and_shared_devices_is_refused():
    results = [_result(device="gpu-0"), _result(device="gpu-1", share=None)]
    with pytest.raises(AllocationError, match="mixes"):
        pod_allocation(results, GPUS, "n", AT, lambda r: ["c"])


def test_a_result_holding_every_share_of_a_shared_gpu_holds_it_whole():
    # What the allocator gives a gpu-count container's request (shares: 20) on a
    # device that shares: a shareID, and consumed capacity that is all of it.
    everything = _result(memory=15 * GIB, cores=0, shares=20)
    (container,) = pod_allocation([everything], GPUS, "n", AT, lambda r: ["c"]).containers
    assert container.exclusive and container.gpus[0].mem == 15
    one_share = _result(memory=15 * GIB, cores=0, shares=1)
    (container,) = pod_allocation([one_share], GPUS, "n", AT, lambda r: ["c"]).containers
    assert not container.exclusive


@pytest.mark.parametrize(
    "limits, name",
    [
        ({"mem": 4}, "gpushare-c2abde0dba"),
        ({"mem": 4, "core": 30}, "gpushare-1248be29a5"),
        ({"count": 2}, "gpushare-d669a93098"),
    ],
)
def test_a_shapes_template_keeps_its_name_across_releases(limits, name):
    # The webhook points pods at these names: a release that renamed them would leave
    # every template already in the cluster behind and create a second one per shape.
    assert template_name(_requests(**limits)) == name


def test_sidecars_are_init_containers_that_always_restart():
    spec = pod(
        "p",
        init_containers=[
            {"name": "fetch", "resources": {}},
            {"name": "proxy", "restartPolicy": "Always", "resources": {}},
        ],
    )
    places = container_places(spec)
    assert places["fetch"] == (ContainerRole.INIT, 0)
    assert places["proxy"] == (ContainerRole.SIDECAR, 1)
    assert places["main"] == (ContainerRole.APP, 0)


def test_each_request_is_named_after_the_container_that_uses_it():
    users = {"first": ["trainer"], "second": ["evaluator"]}.__getitem__
    results = [_result(request="first", device="gpu-0"), _result(request="second")]
    allocation = pod_allocation(results, GPUS, "n", AT, users)
    assert [c.name for c in allocation.containers] == ["trainer", "evaluator"]


def test_a_gpu_held_whole_records_all_its_memory_whatever_the_result_consumed():
    everything = _result(memory=4 * GIB, cores=0, shares=20)
    (container,) = pod_allocation([everything], GPUS, "n", AT, lambda r: ["c"]).containers
    assert container.exclusive and container.gpus[0].mem == 15


def test_a_shared_result_without_memory_consumed_records_the_gpus_memory():
    allocation = pod_allocation([_result(memory=None)], GPUS, "n", AT, lambda r: ["c"])
    assert allocation.containers[0].gpus[0].mem == 15


def test_all_of_a_gpus_compute_is_a_valid_share():
    allocation = pod_allocation([_result(cores=100)], GPUS, "n", AT, lambda r: ["c"])
    assert allocation.containers[0].gpus[0].core == 100
    with pytest.raises(AllocationError, match="101 percent"):
        pod_allocation([_result(cores=101)], GPUS, "n", AT, lambda r: ["c"])


def test_the_device_class_selects_every_device_of_this_driver():
    (selector,) = device_class().spec.selectors
    assert selector.cel.expression == f'device.driver == "{DRIVER}"'
    assert device_class().metadata.name == DEVICE_CLASS
