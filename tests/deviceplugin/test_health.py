"""GPU health: the mock backend's switches, and the XID rules of the nvml backend."""

import json

from gpushare.deviceplugin.devices import HEALTHY, UNHEALTHY
from gpushare.gpunode.backends.health import APPLICATION_XIDS, XidHealth, is_critical_xid
from gpushare.inventory import NODE_GPUS_ANNOTATION
from gpushare.resources import GPU_COUNT, GPU_MEM
from tests.deviceplugin.rig import WAIT, eventually


def _health_by_gpu(devices, uuid):
    return {h for i, h in devices.items() if i.startswith(uuid)}


def _published(rig):
    node = rig.cluster.get_node(rig.node)
    records = json.loads(node.metadata.annotations[NODE_GPUS_ANNOTATION])
    return {g["index"]: g["healthy"] for g in records}


def test_a_flipped_gpu_turns_its_devices_unhealthy_and_back(make_rig):
    rig = make_rig(layout="2x16GiB").start()
    sick = rig.plugin.node.snapshot().inventory[1].uuid
    healthy = rig.plugin.node.snapshot().inventory[0].uuid

    rig.backend.set_healthy(1, False)

    assert rig.kubelet.wait_for(
        lambda: (
            rig.kubelet.capacity(GPU_MEM) == (32, 16) and rig.kubelet.capacity(GPU_COUNT) == (2, 1)
        ),
        WAIT,
    )
    assert _health_by_gpu(rig.kubelet.devices(GPU_MEM), sick) == {UNHEALTHY}
    assert _health_by_gpu(rig.kubelet.devices(GPU_MEM), healthy) == {HEALTHY}
    assert eventually(lambda: _published(rig) == {0: True, 1: False})
    assert rig.plugin.metrics.value("gpushare_gpu_healthy", gpu="1") == 0
    assert rig.plugin.metrics.value("gpushare_gpu_healthy", gpu="0") == 1
    advertised = "gpushare_device_plugin_advertised_devices"
    # The healthy devices of the list the kubelet got: one GPU's 16 GiB, one whole GPU.
    assert rig.plugin.metrics.value(advertised, resource=GPU_MEM) == 16
    assert rig.plugin.metrics.value(advertised, resource=GPU_COUNT) == 1

    rig.backend.set_healthy(1, True)

    assert rig.kubelet.wait_for(
        lambda: (
            rig.kubelet.capacity(GPU_MEM) == (32, 32) and rig.kubelet.capacity(GPU_COUNT) == (2, 2)
        ),
        WAIT,
    )
    assert eventually(lambda: _published(rig) == {0: True, 1: True})
    assert rig.plugin.metrics.value(advertised, resource=GPU_MEM) == 32


def test_the_kubelet_picks_no_device_of_an_unhealthy_gpu(make_rig):
    rig = make_rig(layout="2x16GiB").start()
    rig.backend.set_healthy(0, False)
    assert rig.kubelet.wait_for(lambda: rig.kubelet.capacity(GPU_MEM)[1] == 16, WAIT)
    uuid = rig.plugin.node.snapshot().inventory[1].uuid
    pod = rig.bind("p", [[1]], mem=16)

    [main] = rig.kubelet.admit(pod)

    assert all(i.startswith(uuid) for i in main.device_ids[GPU_MEM])


def test_an_operator_file_lists_the_unhealthy_gpus(make_rig):
    rig = make_rig(layout="3x8GiB").start()

    rig.health_file.write_text("0, 2\n")
    assert rig.kubelet.wait_for(lambda: rig.kubelet.capacity(GPU_COUNT) == (3, 1), WAIT)
    assert eventually(lambda: _published(rig) == {0: False, 1: True, 2: False})

    rig.health_file.write_text("")
    assert rig.kubelet.wait_for(lambda: rig.kubelet.capacity(GPU_COUNT) == (3, 3), WAIT)


def test_a_malformed_health_file_is_ignored(make_rig, caplog):
    rig = make_rig(layout="1x8GiB").start()

    rig.health_file.write_text("the first one")

    assert eventually(lambda: "should list GPU indices" in caplog.text)
    assert rig.kubelet.capacity(GPU_COUNT) == (1, 1)


def test_application_xids_leave_the_gpu_healthy():
    health = XidHealth(quiet_period=60)
    for xid in sorted(APPLICATION_XIDS):
        assert not is_critical_xid(xid)
        assert health.on_xid(0, xid, now=0.0) is None
    assert health.unhealthy == frozenset()
    assert {13, 31, 43, 45, 68, 109} == APPLICATION_XIDS


def test_a_critical_xid_takes_the_gpu_out_until_a_quiet_probe_passes():
    health = XidHealth(quiet_period=60)

    out = health.on_xid(1, 79, now=100.0)
    assert out is not None and (out.index, out.healthy) == (1, False)
    assert "79" in out.reason
    assert health.on_xid(1, 48, now=130.0) is None  # already out: no second change
    assert health.due_for_probe(now=170.0) == []  # quiet for 40 s only
    assert health.due_for_probe(now=190.0) == [1]
    assert health.on_probe(1, ok=False, now=190.0) is None  # still broken: wait again
    assert health.due_for_probe(now=200.0) == []

    back = health.on_probe(1, ok=True, now=250.0)

    assert back is not None and (back.index, back.healthy) == (1, True)
    assert "recovered from critical XID 48" in back.reason
    assert health.unhealthy == frozenset()
