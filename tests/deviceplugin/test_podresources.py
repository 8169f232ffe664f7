"""Confirming allocations through the kubelet's PodResources API and repairing
annotations that disagree with it (the kubelet's truth wins)."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from gpushare import annotation
from gpushare import grant as grants
from gpushare.cluster import EventSeverity
from gpushare.deviceplugin.podresources import holdings, list_pod_resources
from gpushare.deviceplugin.reconcile import EVENT_REASON
from gpushare.environment import GRANT_IN_CONTAINER, MEM_IDX, NVIDIA_VISIBLE_DEVICES, POD
from gpushare.kubeletapi.podresources.v1 import api_pb2 as pr
from gpushare.kubeletapi.podresources.v1 import api_pb2_grpc as pr_grpc
from gpushare.resources import GPU_CORE, GPU_MEM, MANAGED_RESOURCES
from tests.deviceplugin.rig import WAIT, eventually


class _FakeKubelet(pr_grpc.PodResourcesListerServicer):
    def __init__(self, response: pr.ListPodResourcesResponse) -> None:
        self.response = response

    def List(self, request, context):
        return self.response


def _numa(*ids: int) -> pr.TopologyInfo:
    return pr.TopologyInfo(nodes=[pr.NUMANode(ID=i) for i in ids])


def test_split_device_entries_are_grouped_per_container_and_resource(short_tmp):
    response = pr.ListPodResourcesResponse(
        pod_resources=[
            pr.PodResources(
                name="p",
                namespace="ns",
                containers=[
                    pr.ContainerResources(
                        name="c",
                        devices=[
                            pr.ContainerDevices(
                                resource_name=GPU_MEM, device_ids=["a"], topology=_numa(0)
                            ),
                            pr.ContainerDevices(
                                resource_name=GPU_MEM, device_ids=["b", "a"], topology=_numa(1)
                            ),
                            pr.ContainerDevices(resource_name=GPU_CORE, device_ids=["x"]),
                            pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["g"]),
                        ],
                    ),
                    pr.ContainerResources(name="cpu-only", cpu_ids=[2, 3]),
                ],
            )
        ]
    )
    socket = short_tmp / "pr.sock"
    server = grpc.server(ThreadPoolExecutor(1))
    pr_grpc.add_PodResourcesListerServicer_to_server(_FakeKubelet(response), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        listed = list_pod_resources(socket)
    finally:
        server.stop(0).wait()

    assert holdings(listed, MANAGED_RESOURCES) == {
        ("ns/p", "c"): {GPU_MEM: frozenset({"a", "b"}), GPU_CORE: frozenset({"x"})}
    }


def test_matching_allocations_are_confirmed_without_repairs(make_rig):
    rig = make_rig(layout="2x16GiB").start()
    pod = rig.bind("p", [[1]], mem=4)
    rig.kubelet.admit(pod)

    assert eventually(lambda: rig.plugin.journal.open_grants() == [])
    assert rig.cluster.events == []
    assert rig.wait_assigned("p").containers[0].gpus[0].index == 1


def test_a_pod_admitted_before_an_older_one_of_its_size_gets_the_annotation_of_its_answer(
    make_rig,
):
    rig = make_rig(layout="2x16GiB").start()
    older = rig.bind("older", [[0]], mem=2)
    younger = rig.bind("younger", [[1]], mem=2)
    gpu0 = rig.allocation("older").containers[0].gpus[0].uuid
    gpu1 = rig.allocation("younger").containers[0].gpus[0].uuid

    # The kubelet admits the younger pod first (say the older one waits for a
    # volume): the plugin matches the call to the oldest waiting container.
    [first] = rig.kubelet.admit(younger)
    assert (first.envs[POD], first.envs[NVIDIA_VISIBLE_DEVICES]) == (older.key, gpu0)

    # PodResources shows the younger pod holds those IDs: its annotation now says
    # GPU 0 (where it runs), and the older pod takes GPU 1 and waits.
    assert eventually(lambda: len(rig.cluster.events) == 2)
    repaired = rig.allocation("younger").containers[0]
    moved = rig.allocation("older").containers[0]
    assert (repaired.gpus[0].uuid, repaired.assigned) == (gpu0, True)
    assert (moved.gpus[0].uuid, moved.assigned) == (gpu1, False)
    pod_of = {e.ref.name: e for e in rig.cluster.events}
    assert {e.reason for e in rig.cluster.events} == {EVENT_REASON}
    assert {e.severity for e in rig.cluster.events} == {EventSeverity.WARNING}
    assert "default/older container main" in pod_of["younger"].message
    assert "waits for its own Allocate" in pod_of["older"].message
    assert rig.plugin.metrics.value("gpushare_device_plugin_annotation_repairs_total") == 2
    # ACK-compatible keys follow the repaired placement.
    older_pod = rig.cluster.get_pod("default", "older")
    assert older_pod.metadata.annotations[MEM_IDX] == "1"

    # The older pod's own admission then gets the GPU its annotation names.
    [second] = rig.kubelet.admit(rig.cluster.get_pod("default", "older"))
    assert (second.envs[POD], second.envs[MEM_IDX]) == (older.key, "1")
    assert rig.wait_assigned("older").containers[0].gpus[0].uuid == gpu1


def test_two_pods_admitted_in_swapped_order_are_both_repaired(make_rig):
    rig = make_rig(layout="2x16GiB").start(reconcile_delay=0.5)
    older = rig.bind("older", [[0]], mem=2)
    younger = rig.bind("younger", [[1]], mem=2)

    [first] = rig.kubelet.admit(younger)
    [second] = rig.kubelet.admit(older)

    # Each container runs with the other's answer; both annotations follow.
    assert eventually(lambda: len(rig.cluster.events) == 2)
    for name, env in (("younger", first.envs), ("older", second.envs)):
        container = rig.allocation(name).containers[0]
        assert container.assigned
        assert str(container.gpus[0].index) == env[MEM_IDX]
        assert container.gpus[0].uuid == env[NVIDIA_VISIBLE_DEVICES]


def test_an_assignment_lost_in_a_plugin_restart_is_restored_from_podresources(make_rig):
    rig = make_rig(layout="1x16GiB").start()
    pod = rig.bind("p", [[0]], mem=2)
    rig.kubelet.admit(pod)
    allocation = rig.wait_assigned("p")
    rig.plugin.stop()
    # The plugin died before its mark reached the API server.
    unmarked = allocation.model_copy(
        update={
            "containers": tuple(
                c.model_copy(update={"assigned": False}) for c in allocation.containers
            )
        }
    )
    rig.cluster.patch_pod_annotations("default", "p", annotation.assigned_annotations(unmarked))

    rig.plugin = rig.new_plugin()
    rig.plugin.start()

    assert eventually(lambda: rig.allocation("p").assigned, WAIT)
    [event] = rig.cluster.events
    assert event.severity is EventSeverity.NORMAL
    assert "holds aliyun.com/gpu-mem devices" in event.message


def test_after_a_swapped_admission_each_grant_names_the_pod_that_runs_under_it(make_rig, short_tmp):
    """Each container keeps the grant its answer mounted (its caps and GPUs); the grant's
    names, which the isolation agent shows it by, follow the repair to the pod that holds it."""
    directory = short_tmp / "interposer"
    directory.mkdir()
    (directory / "libgpushare-cuda.so").write_bytes(b"\x7fELF")
    (directory / "ld.so.preload").write_text("/usr/local/lib/gpushare/libgpushare-cuda.so\n")
    rig = make_rig(layout="2x16GiB", interposer_dir=directory).start(reconcile_delay=0.5)
    older = rig.bind("older", [[0]], mem=2)
    younger = rig.bind("younger", [[1]], mem=2)

    [first] = rig.kubelet.admit(younger)  # answered as older's container
    [second] = rig.kubelet.admit(older)  # answered as younger's

    def grant_of(answer) -> grants.Grant:
        [mount] = [m for m in answer.mounts if m.container_path == GRANT_IN_CONTAINER]
        return grants.decode(Path(mount.host_path).read_bytes())

    assert first.envs[POD] == "default/older"  # what the plugin matched it to
    assert eventually(lambda: grant_of(first).pod_key == "default/younger", WAIT)
    assert eventually(lambda: grant_of(second).pod_key == "default/older", WAIT)
    assert grant_of(first).pod_uid == younger.metadata.uid
    assert grant_of(second).pod_uid == older.metadata.uid
    # What each container was started with does not change under it.
    assert grant_of(first).uuids == (first.envs[NVIDIA_VISIBLE_DEVICES],)
    assert grant_of(second).uuids == (second.envs[NVIDIA_VISIBLE_DEVICES],)
