"""The DRA health stream (DRA-INTERFACES §2c) between the real driver and the kubelet
stand-in over the real DRA socket: every GPU's health, at the start, at each change and
again before the kubelet's timeout; a GPU the slice dropped still named, with why."""

import pytest

from gpushare.dra.slices import device_name
from gpushare.draplugin.health import HEALTH_TIMEOUT_S, MAX_STREAMS, RESEND_S, HealthService
from gpushare.draplugin.node import DriverNode
from gpushare.gpunode.backends.port import HealthChange, PhysicalGpu
from gpushare.inventory import parse_layout
from gpushare.kubeletapi.dra.health.v1alpha1 import api_pb2 as health
from gpushare.standins.drahealth import DeviceHealth
from tests.draplugin.driverrig import DRIVER, NODE, DriverRig
from tests.draplugin.rig import eventually


@pytest.fixture
def rig(short_tmp):
    node = DriverRig(short_tmp, resource_health=True).start()
    yield node
    node.stop()


def _health(rig: DriverRig, index: int) -> DeviceHealth:
    return rig.kubelet.device_health(DRIVER, NODE, device_name(index))


def test_the_kubelet_reads_every_gpus_health_from_the_stream(rig):
    assert eventually(lambda: _health(rig, 0).status == "Healthy")
    assert _health(rig, 1) == DeviceHealth("Healthy")
    assert _health(rig, 2).status == "Unknown"  # no such GPU


def test_a_gpu_going_bad_is_told_with_why_though_the_slice_drops_it(rig):
    assert eventually(lambda: _health(rig, 1).status == "Healthy")
    (rig.workdir / "unhealthy").write_text("1\n")
    assert eventually(lambda: _health(rig, 1).status == "Unhealthy")
    # With the backend's reason, once its health event is in (a rediscovery may show
    # the GPU unhealthy a moment before).
    reason = f"GPU 1 is unhealthy: listed in {rig.workdir / 'unhealthy'}"
    assert eventually(lambda: _health(rig, 1).message == reason)
    assert [d.name for d in rig.slices()[0].spec.devices] == ["gpu-0"]
    (rig.workdir / "unhealthy").write_text("")
    assert eventually(lambda: _health(rig, 1) == DeviceHealth("Healthy"))


def test_a_restarted_driver_is_watched_again(rig):
    watcher = rig.kubelet.health_watcher(DRIVER)
    assert watcher is not None and eventually(lambda: watcher.streams_opened == 1)
    rig.restart_driver()
    # A new plugin registered: the kubelet watches the newest one's stream.
    renewed = rig.kubelet.health_watcher(DRIVER)
    assert renewed is not watcher and eventually(lambda: renewed.streams_opened >= 1)
    assert eventually(lambda: _health(rig, 0).status == "Healthy")


def test_without_the_gate_the_kubelet_opens_no_stream(short_tmp):
    rig = DriverRig(short_tmp).start()
    try:
        assert rig.kubelet.health_watcher(DRIVER) is None
        assert _health(rig, 0).status == "Unknown"
    finally:
        rig.stop()


# ----- the service on its own: messages and timing


class _Context:
    """A grpc.ServicerContext as the stream sees it."""

    def __init__(self) -> None:
        self.active = True
        self.callbacks: list = []

    def is_active(self) -> bool:
        return self.active

    def add_callback(self, callback) -> bool:
        self.callbacks.append(callback)
        return True

    def abort(self, code, details):
        raise RuntimeError(f"{code.name}: {details}")


def _node() -> DriverNode:
    node = DriverNode("n1")
    node.set_gpus(tuple(PhysicalGpu(g, g.index) for g in parse_layout("2x16GiB", "n1")))
    return node


def test_each_message_names_every_gpu_of_the_pool_with_the_timeout():
    node = _node()
    node.health_changed(HealthChange(0, False, "XID 79: fallen off the bus"))
    message = HealthService(node, clock=lambda: 1_700_000_000.7).response(node.snapshot())
    first, second = message.devices
    assert (first.device.pool_name, first.device.device_name) == ("n1", "gpu-0")
    assert first.health == health.UNHEALTHY
    assert first.message == "GPU 0 is unhealthy: XID 79: fallen off the bus"
    assert (second.device.device_name, second.health, second.message) == (
        "gpu-1",
        health.HEALTHY,
        "",
    )
    assert first.last_updated_time == 1_700_000_000
    assert first.health_check_timeout_seconds == HEALTH_TIMEOUT_S > RESEND_S


def test_a_message_goes_out_at_each_change_and_again_when_nothing_changes():
    node = _node()
    context = _Context()
    stream = HealthService(node, resend_s=0.05).NodeWatchResources(None, context)
    assert [d.health for d in next(stream).devices] == [health.HEALTHY] * 2
    node.health_changed(HealthChange(1, False, "gone"))
    assert [d.health for d in next(stream).devices] == [health.HEALTHY, health.UNHEALTHY]
    assert [d.health for d in next(stream).devices] == [health.HEALTHY, health.UNHEALTHY]
    context.active = False
    for callback in context.callbacks:
        callback()
    assert list(stream) == []  # the stream ends once the kubelet has gone


def test_streams_beyond_the_limit_are_refused():
    service = HealthService(_node(), resend_s=0.05)
    streams = [service.NodeWatchResources(None, _Context()) for _ in range(MAX_STREAMS)]
    for stream in streams:
        next(stream)
    assert service.open_streams == MAX_STREAMS
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        next(service.NodeWatchResources(None, _Context()))
    streams[0].close()
    assert service.open_streams == MAX_STREAMS - 1
