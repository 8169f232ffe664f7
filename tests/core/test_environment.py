"""The container environment contract, written by the plugin and read by the agent."""

import pytest

from gpushare import environment as env
from gpushare.objects import Pod
from gpushare.placement.fit import Placement, evaluate, to_allocation
from gpushare.placement.policies import BinpackPolicy
from gpushare.request import parse_pod_request
from tests.builders import T0, container, node_state, pod


def allocated(p: Pod, layout: str = "4x16GiB", **kwargs):
    request = parse_pod_request(p)
    assert request is not None
    state = node_state(layout, **kwargs)
    result = evaluate(state.view(), request, BinpackPolicy())
    assert isinstance(result, Placement)
    return to_allocation(request, result.assignment, state.inventory, T0)


def test_a_slice_gets_the_cgpu_variables():
    p = pod("a", mem=3)
    allocation = allocated(p)
    variables = env.container_env(p, allocation, allocation.containers[0], isolation_disabled=False)
    gpu = allocation.containers[0].gpus[0]
    assert variables["NVIDIA_VISIBLE_DEVICES"] == gpu.uuid
    assert variables["ALIYUN_COM_GPU_MEM_IDX"] == "0"
    assert variables["ALIYUN_COM_GPU_MEM_CONTAINER"] == "3"
    assert variables["ALIYUN_COM_GPU_MEM_DEV"] == "16"
    assert variables["ALIYUN_COM_GPU_MEM_POD"] == "3"
    assert variables["ALIYUN_COM_GPU_SCHD_WEIGHT"] == "1"
    assert variables["ALIYUN_COM_GPU_HIGH_PRIO"] == "0"
    assert "CGPU_DISABLE" not in variables


def test_multi_gpu_slices_are_comma_lists():
    p = pod("split", mem=8, labels={"aliyun.com/gpu-count": "4"})
    allocation = allocated(p)
    variables = env.container_env(p, allocation, allocation.containers[0], False)
    assert variables["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2,2,2,2"
    assert variables["ALIYUN_COM_GPU_MEM_IDX"] == "0,1,2,3"
    assert len(variables["NVIDIA_VISIBLE_DEVICES"].split(",")) == 4


def test_share_mode_and_exclusive_gpus_run_without_isolation():
    p = pod("a", mem=3)
    allocation = allocated(p)
    assert (
        env.container_env(p, allocation, allocation.containers[0], True)["CGPU_DISABLE"] == "true"
    )
    whole = pod("w", count=1)
    allocation = allocated(whole)
    assert (
        env.container_env(whole, allocation, allocation.containers[0], False)["CGPU_DISABLE"]
        == "true"
    )


def test_weight_and_priority_come_from_the_pods_own_env():
    spec = container("c", mem=2)
    spec["env"] = [
        {"name": "ALIYUN_COM_GPU_SCHD_WEIGHT", "value": "4"},
        {"name": "ALIYUN_COM_GPU_HIGH_PRIO", "value": "1"},
    ]
    p = pod("weighted", containers=[spec])
    allocation = allocated(p)
    variables = env.container_env(p, allocation, allocation.containers[0], False)
    limits = env.limits_from_env(variables)
    assert limits is not None
    assert limits.weight == 4 and limits.high_priority


def test_the_agent_reads_back_what_the_plugin_wrote():
    p = pod("a", mem=2, core=30)
    allocation = allocated(p, mode="core_mem")
    variables = env.container_env(p, allocation, allocation.containers[0], False)
    limits = env.limits_from_env(variables)
    assert limits == env.ContainerLimits(
        pod="default/a",
        container="main",
        gpu_uuids=(allocation.containers[0].gpus[0].uuid,),
        gpu_indices=(0,),
        mem_gib=(2,),
        dev_mem_gib=(16,),
        core_percent=(30,),
    )


def test_processes_gpushare_did_not_start_have_no_limits():
    assert env.limits_from_env({"PATH": "/bin"}) is None


def test_a_malformed_variable_is_named():
    with pytest.raises(ValueError, match="ALIYUN_COM_GPU_MEM_CONTAINER"):
        env.limits_from_env({"ALIYUN_COM_GPU_MEM_CONTAINER": "two"})


def test_whole_gpus_carry_no_compute_percentage():
    """An exclusive container is not time-sliced: 0 is no compute cap."""
    whole = pod("w", count=2)
    allocation = allocated(whole)
    variables = env.container_env(whole, allocation, allocation.containers[0], False)
    assert variables[env.CORE_PERCENTAGE] == "0,0"


def test_an_init_container_gets_its_own_weight_and_priority():
    init = container("warmup", mem=2)
    init["env"] = [
        {"name": "ALIYUN_COM_GPU_SCHD_WEIGHT", "value": "3"},
        {"name": "ALIYUN_COM_GPU_HIGH_PRIO", "value": "true"},
    ]
    p = pod("staged", containers=[container("main", mem=2)], init_containers=[init])
    allocation = allocated(p)
    warmup = next(c for c in allocation.containers if c.name == "warmup")
    variables = env.container_env(p, allocation, warmup, False)
    assert variables["ALIYUN_COM_GPU_SCHD_WEIGHT"] == "3"
    assert variables["ALIYUN_COM_GPU_HIGH_PRIO"] == "true"


@pytest.mark.parametrize("index", [1, 5], ids=["just-past-the-end", "far-past-the-end"])
def test_an_allocation_whose_index_the_spec_lacks_reads_its_container_by_name(index):
    """A pod re-created with fewer containers than its allocation remembers: the
    container is found by its name (as the plugin's admission finds it), and one the
    spec no longer has starts with the default weight, not a crash of Allocate."""
    spec = container("main", mem=2)
    spec["env"] = [{"name": "ALIYUN_COM_GPU_SCHD_WEIGHT", "value": "4"}]
    p = pod("shrunk", containers=[spec])
    allocation = allocated(p)
    moved = allocation.containers[0].model_copy(update={"index": index})
    assert env.container_env(p, allocation, moved, False)["ALIYUN_COM_GPU_SCHD_WEIGHT"] == "4"
    gone = moved.model_copy(update={"name": "removed"})
    assert env.container_env(p, allocation, gone, False)["ALIYUN_COM_GPU_SCHD_WEIGHT"] == "1"


def test_only_the_memory_variable_is_needed_and_the_rest_default():
    limits = env.limits_from_env({"ALIYUN_COM_GPU_MEM_CONTAINER": "4,4"})
    assert limits == env.ContainerLimits(
        pod="",
        container="",
        gpu_uuids=(),
        gpu_indices=(),
        mem_gib=(4, 4),
        dev_mem_gib=(0, 0),
        core_percent=(0, 0),
    )
    assert limits.weight == 1 and not limits.high_priority and not limits.isolation_disabled


@pytest.mark.parametrize(
    ("value", "on"),
    [
        ("1", True),
        ("true", True),
        (" TRUE ", True),
        ("True", True),
        ("0", False),
        ("false", False),
        ("", False),
        ("yes", False),
    ],
)
def test_switches_are_on_for_1_or_true_in_any_case(value, on):
    limits = env.limits_from_env(
        {
            "ALIYUN_COM_GPU_MEM_CONTAINER": "4",
            "ALIYUN_COM_GPU_HIGH_PRIO": value,
            "CGPU_DISABLE": value,
        }
    )
    assert limits is not None
    assert limits.high_priority is on and limits.isolation_disabled is on
