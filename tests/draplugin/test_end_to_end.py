"""DRA mode end to end on the stand-ins: the webhook rewrites ACK pods, the scheduler
stand-in allocates their claims from the slice the driver published (the allocator's
first eligible device), the kubelet stand-in has the driver prepare them. The GPU's
capacity holds at every step: what the allocator refuses never reaches the node."""

import pytest

from gpushare.dra.allocator import Allocation, Unfit
from gpushare.dra.claims import device_class
from gpushare.environment import CGPU_DISABLE, CORE_PERCENTAGE, MEM_CONTAINER, MEM_IDX
from gpushare.objects import Pod
from gpushare.standins.claimcontroller import admit_ack_pod
from gpushare.standins.draallocation import DraAllocationStandIn
from tests.builders import pod
from tests.draplugin.driverrig import NODE, DriverRig, Placed


@pytest.fixture
def rig(short_tmp):
    node = DriverRig(short_tmp, mode="core_mem", layout="2x16GiB").start()
    node.store.create_device_class(device_class())
    yield node
    node.stop()


def _schedule(rig: DriverRig, ack_pod: Pod) -> Placed | Unfit:
    """What the API server, the claim controller and kube-scheduler do with the pod."""
    admitted = admit_ack_pod(rig.store, ack_pod)
    assert admitted is not None
    created, name = admitted.pod, admitted.claim.metadata.name
    outcome = DraAllocationStandIn(rig.store).allocate("default", name, NODE, created)
    if isinstance(outcome, Unfit):
        return outcome
    assert isinstance(outcome, Allocation)
    return Placed(created, rig.store.get_resource_claim("default", name))


def _prepared_env(rig: DriverRig, placed: Placed) -> dict[str, str]:
    rig.kubelet.prepare(placed.pod.metadata.uid, [placed.pod_claim])
    uid = placed.claim.metadata.uid
    return rig.kubelet.container_edits(placed.pod.metadata.uid, uid, "main").env


def test_pods_fill_the_gpus_the_allocator_picks_in_slice_order(rig):
    first = _schedule(rig, pod("a", mem=10, core=50))
    second = _schedule(rig, pod("b", mem=10, core=50))
    third = _schedule(rig, pod("c", mem=6, core=50))
    env = [_prepared_env(rig, p) for p in (first, second, third)]
    # First eligible device: a on gpu-0; b does not fit beside it (20 > 16 GiB): gpu-1;
    # c fits beside a on gpu-0 (16 GiB, 100 percent).
    assert [e[MEM_IDX] for e in env] == ["0", "1", "0"]
    assert [e[MEM_CONTAINER] for e in env] == ["10", "10", "6"]
    assert [e[CORE_PERCENTAGE] for e in env] == ["50", "50", "50"]


def test_what_does_not_fit_is_refused_by_the_allocator_with_the_reason(rig):
    _prepared_env(rig, _schedule(rig, pod("a", mem=16)))
    _prepared_env(rig, _schedule(rig, pod("b", mem=16)))
    refused = _schedule(rig, pod("c", mem=1))
    assert isinstance(refused, Unfit)
    assert "memory" in str(refused)


def test_a_whole_gpu_and_slices_do_not_share_a_gpu(rig):
    whole = _schedule(rig, pod("w", count=1))
    _prepared_env(rig, whole)
    sliced = _schedule(rig, pod("s", mem=2))
    assert isinstance(sliced, Placed)
    assert (
        _prepared_env(rig, sliced)[MEM_IDX]
        != whole.claim.results_for("gpu.gpushare.io")[0].device[-1]
    )


def test_twenty_claims_a_gpu_at_most(short_tmp):
    rig = DriverRig(short_tmp, mode="cgpu", layout="1x40GiB").start()
    try:
        rig.store.create_device_class(device_class())
        placed = [_schedule(rig, pod(f"p{i}", mem=1)) for i in range(21)]
        assert all(isinstance(p, Placed) for p in placed[:20])
        assert isinstance(placed[20], Unfit) and "shares" in str(placed[20])
        assert {_prepared_env(rig, p)[MEM_IDX] for p in placed[:20]} == {"0"}
    finally:
        rig.stop()


def test_a_whole_gpu_through_the_allocator_is_given_uncapped(rig):
    env = _prepared_env(rig, _schedule(rig, pod("w", count=1)))
    assert env[CGPU_DISABLE] == "true" and env[MEM_CONTAINER] == "16"
