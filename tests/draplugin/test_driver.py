"""gpushare-dra-plugin on a node: the slice it publishes and keeps current, and the
claims it prepares through the kubelet stand-in over real sockets — the environment,
interposer and device files a device-plugin container gets, recorded so that a retry,
a restart or a damaged record never hands a GPU's capacity out twice."""

import json

import pytest

from gpushare.cli.inspect import collect
from gpushare.dra.claims import CORES, MEMORY
from gpushare.draplugin.books import FILE_NAME
from gpushare.environment import (
    CGPU_DISABLE,
    CORE_PERCENTAGE,
    GRANT_IN_CONTAINER,
    MEM_CONTAINER,
    MEM_DEV,
    MEM_IDX,
    MEM_POD,
    NVIDIA_VISIBLE_DEVICES,
    POD,
)
from gpushare.grant import decode
from gpushare.inventory import parse_layout
from gpushare.labels import LABEL_SCHEDULE
from gpushare.standins.drakubelet import PrepareFailed
from tests.builders import pod
from tests.draplugin.driverrig import NODE, DriverRig, shared, whole
from tests.draplugin.rig import eventually


@pytest.fixture
def rig(short_tmp):
    node = DriverRig(short_tmp).start()
    yield node
    node.stop()


def _env(rig, placed, container="main"):
    edits = rig.kubelet.container_edits(
        placed.pod.metadata.uid, placed.claim.metadata.uid, container
    )
    return edits


# ----- the slice


def test_the_node_is_published_as_one_pool_of_its_gpus(rig):
    (published,) = rig.slices()
    assert published.spec.pool.name == NODE
    assert [d.name for d in published.spec.devices] == ["gpu-0", "gpu-1"]
    device = published.spec.devices[0]
    assert device.allow_multiple_allocations
    assert device.capacity[MEMORY].value == "16Gi"
    assert CORES not in device.capacity  # cgpu isolates memory, not compute
    (owner,) = published.metadata.owner_references
    assert owner.uid == rig.store.get_node(NODE).metadata.uid


def test_an_unhealthy_gpu_leaves_the_slice_and_comes_back(rig):
    (rig.workdir / "unhealthy").write_text("1\n")
    assert eventually(lambda: [d.name for d in rig.slices()[0].spec.devices] == ["gpu-0"])
    generation = rig.slices()[0].spec.pool.generation
    assert generation >= 1
    (rig.workdir / "unhealthy").write_text("")
    assert eventually(lambda: len(rig.slices()[0].spec.devices) == 2)
    assert rig.slices()[0].spec.pool.generation > generation


def test_a_mode_change_republishes_the_capacities(rig):
    rig.store.set_node_labels(NODE, {LABEL_SCHEDULE: "core_mem"})
    assert eventually(lambda: CORES in rig.slices()[0].spec.devices[0].capacity)
    rig.store.set_node_labels(NODE, {LABEL_SCHEDULE: None})
    assert eventually(lambda: not rig.slices()[0].spec.devices[0].allow_multiple_allocations)


def test_a_slice_the_kubelet_wiped_is_published_again(rig):
    rig.store.delete_resource_slices(NODE)
    assert eventually(lambda: len(rig.slices()) == 1)


def test_the_slice_is_withdrawn_on_uninstall(rig):
    rig.driver.publisher.withdraw()
    rig.stop_driver()
    assert rig.slices() == []


# ----- prepare


def test_a_prepared_slice_gets_the_device_plugins_environment_and_the_interposer(rig):
    placed = rig.place(pod("train", mem=4), [shared("main", "gpu-1", 4)])
    rig.kubelet.prepare(placed.pod.metadata.uid, [placed.pod_claim])
    edits = _env(rig, placed)
    gpu = rig.backend.discover()[1].gpu
    assert edits.env[NVIDIA_VISIBLE_DEVICES] == gpu.uuid
    assert (edits.env[MEM_IDX], edits.env[MEM_CONTAINER], edits.env[MEM_DEV]) == ("1", "4", "16")
    assert edits.env[MEM_POD] == "4"
    assert edits.env[POD] == "default/train"
    assert CGPU_DISABLE not in edits.env
    grant_mount = next(m for m in edits.mounts if m.container_path == GRANT_IN_CONTAINER)
    with open(grant_mount.host_path, "rb") as granted:
        grant = decode(granted.read())
    assert (grant.pod_uid, grant.container) == (placed.pod.metadata.uid, "main")


def test_a_compute_share_reaches_the_environment(short_tmp):
    rig = DriverRig(short_tmp, mode="core_mem").start()
    try:
        placed = rig.place(pod("p", mem=4, core=30), [shared("main", "gpu-0", 4, cores=30)])
        rig.kubelet.prepare(placed.pod.metadata.uid, [placed.pod_claim])
        assert _env(rig, placed).env[CORE_PERCENTAGE] == "30"
    finally:
        rig.stop()


def test_a_whole_gpu_is_given_without_a_cap(rig):
    placed = rig.place(pod("w", count=1), [whole("main", "gpu-0")])
    rig.kubelet.prepare(placed.pod.metadata.uid, [placed.pod_claim])
    edits = _env(rig, placed)
    assert edits.env[CGPU_DISABLE] == "true" and edits.env[MEM_CONTAINER] == "16"
    assert edits.mounts == []  # no interposer for an uncapped GPU


def test_a_repeated_prepare_gets_the_same_answer(rig):
    placed = rig.place(pod("p", mem=4), [shared("main", "gpu-0", 4)])
    rig.kubelet.prepare(placed.pod.metadata.uid, [placed.pod_claim])
    first = rig.kubelet.devices(placed.claim.metadata.uid)
    rig.kubelet.restart()  # a restarted kubelet prepares its claims again
    assert rig.kubelet.wait_for(lambda: "gpu.gpushare.io" in rig.kubelet.registered(), 5)
    rig.kubelet.prepare(placed.pod.metadata.uid, [placed.pod_claim])
    assert rig.kubelet.devices(placed.claim.metadata.uid) == first


def test_a_driver_restarted_after_prepare_keeps_the_claims_share(rig):
    first = rig.place(pod("a", mem=12), [shared("main", "gpu-0", 12)])
    rig.kubelet.prepare(first.pod.metadata.uid, [first.pod_claim])
    rig.restart_driver()
    second = rig.place(pod("b", mem=8), [shared("main", "gpu-0", 8)])
    with pytest.raises(PrepareFailed, match="12 of 16 GiB held, 8 GiB asked"):
        rig.kubelet.prepare(second.pod.metadata.uid, [second.pod_claim])


def test_a_claim_beyond_what_is_left_is_refused_with_the_numbers(rig):
    first = rig.place(pod("a", mem=10), [shared("main", "gpu-1", 10)])
    rig.kubelet.prepare(first.pod.metadata.uid, [first.pod_claim])
    second = rig.place(pod("b", mem=7), [shared("main", "gpu-1", 7)])
    with pytest.raises(PrepareFailed, match=r"over-commit.*GPU 1: 10 of 16 GiB held, 7 GiB asked"):
        rig.kubelet.prepare(second.pod.metadata.uid, [second.pod_claim])
    assert not list(rig.cdi_dir.glob(f"*{second.claim.metadata.uid}*"))


def test_a_slice_beside_a_whole_gpu_is_refused(rig):
    first = rig.place(pod("a", count=1), [whole("main", "gpu-0")])
    rig.kubelet.prepare(first.pod.metadata.uid, [first.pod_claim])
    second = rig.place(pod("b", mem=1), [shared("main", "gpu-0", 1)])
    with pytest.raises(PrepareFailed, match="GPU 0 is held by 1 prepared claim"):
        rig.kubelet.prepare(second.pod.metadata.uid, [second.pod_claim])


def test_a_damaged_record_is_rebuilt_from_the_cdi_specs(rig):
    first = rig.place(pod("a", mem=12), [shared("main", "gpu-0", 12)])
    rig.kubelet.prepare(first.pod.metadata.uid, [first.pod_claim])
    rig.driver.stop()  # a crash: the record is damaged while it is down
    (rig.state_dir / FILE_NAME).write_text("{not json")
    rig.driver = None
    rig.restart_driver()
    second = rig.place(pod("b", mem=8), [shared("main", "gpu-0", 8)])
    with pytest.raises(PrepareFailed, match="12 of 16 GiB held"):
        rig.kubelet.prepare(second.pod.metadata.uid, [second.pod_claim])


def test_a_claim_allocated_elsewhere_is_refused(rig):
    placed = rig.place(pod("p", mem=4), [shared("main", "gpu-7", 4)])
    with pytest.raises(PrepareFailed, match="GPU 7 absent"):
        rig.kubelet.prepare(placed.pod.metadata.uid, [placed.pod_claim])


# ----- unprepare


def test_unprepare_frees_the_capacity_and_removes_the_spec(rig):
    first = rig.place(pod("a", mem=12), [shared("main", "gpu-0", 12)])
    rig.kubelet.prepare(first.pod.metadata.uid, [first.pod_claim])
    assert list(rig.cdi_dir.glob(f"*{first.claim.metadata.uid}*"))
    rig.kubelet.unprepare(first.pod.metadata.uid)
    assert not list(rig.cdi_dir.glob(f"*{first.claim.metadata.uid}*"))
    record = json.loads((rig.state_dir / FILE_NAME).read_text())
    assert record["claims"] == []
    second = rig.place(pod("b", mem=8), [shared("main", "gpu-0", 8)])
    rig.kubelet.prepare(second.pod.metadata.uid, [second.pod_claim])


# ----- what operators see


def test_kubectl_inspect_cgpu_shows_the_prepared_pods(rig):
    placed = rig.place(pod("train", mem=4), [shared("main", "gpu-1", 4)])
    rig.kubelet.prepare(placed.pod.metadata.uid, [placed.pod_claim])
    (report,), problems = collect(rig.store)
    assert problems == []
    assert (report.name, report.totals, report.used) == (NODE, (16, 16), (0, 4))
    assert [(name, gib) for name, _, gib in report.pods] == [("train", (0, 4))]


def test_the_metrics_count_outcomes_and_what_the_claims_hold(rig):
    registry = rig.driver.metrics.registry

    def value(name, **labels):
        return registry.get_sample_value(name, {"node": NODE, **labels})

    assert value("gpushare_dra_plugin_prepares_total", outcome="over-commit") == 0
    first = rig.place(pod("a", mem=10), [shared("main", "gpu-1", 10)])
    rig.kubelet.prepare(first.pod.metadata.uid, [first.pod_claim])
    second = rig.place(pod("b", mem=7), [shared("main", "gpu-1", 7)])
    with pytest.raises(PrepareFailed):
        rig.kubelet.prepare(second.pod.metadata.uid, [second.pod_claim])
    assert value("gpushare_dra_plugin_prepares_total", outcome="prepared") == 1
    assert value("gpushare_dra_plugin_prepares_total", outcome="over-commit") == 1
    assert value("gpushare_dra_plugin_gpu_memory_held_gib", gpu="1") == 10
    assert value("gpushare_dra_plugin_gpu_claims", gpu="1") == 1
    assert value("gpushare_dra_plugin_sharing") == 1
    assert value("gpushare_dra_plugin_slice_writes_total") >= 1


def test_a_gpu_added_or_gone_is_published(rig):
    rig.backend.set_gpus(parse_layout("3x16GiB", NODE))
    assert eventually(lambda: len(rig.slices()[0].spec.devices) == 3)
    rig.backend.set_gpus(parse_layout("1x16GiB", NODE))
    assert eventually(lambda: [d.name for d in rig.slices()[0].spec.devices] == ["gpu-0"])
