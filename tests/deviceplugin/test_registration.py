"""Registration with the kubelet, ListAndWatch, and kubelet restarts
(docs/contracts.md#device-plugin-registration, docs/contracts.md#kubelet-restarts)."""

import logging
import os
import stat
import time

import grpc

from gpushare.deviceplugin import registration as registration_module
from gpushare.deviceplugin.registration import REGISTER_BACKOFF, SOCKET_NAMES
from gpushare.resources import GPU_CORE, GPU_COUNT, GPU_MEM
from tests.deviceplugin.rig import WAIT, eventually


def test_registers_each_resource_of_the_mode_with_a_bare_endpoint(make_rig):
    rig = make_rig(layout="2x16GiB,1x80GiB", mode="cgpu").start()

    by_resource = {r.resource: r for r in rig.kubelet.registrations}
    assert set(by_resource) == {GPU_MEM, GPU_COUNT}
    for resource, registration in by_resource.items():
        assert registration.endpoint == SOCKET_NAMES[resource]
        assert "/" not in registration.endpoint
        assert registration.options.get_preferred_allocation_available
        socket = rig.kubelet.plugin_dir / registration.endpoint
        assert stat.S_ISSOCK(os.stat(socket).st_mode)


def test_list_and_watch_sends_one_id_per_gib_per_gpu_and_per_percent(make_rig):
    rig = make_rig(layout="2x16GiB,1x80GiB", mode="core_mem").start()

    assert rig.kubelet.capacity(GPU_MEM) == (112, 112)
    assert rig.kubelet.capacity(GPU_COUNT) == (3, 3)
    assert rig.kubelet.capacity(GPU_CORE) == (300, 300)
    ids = list(rig.kubelet.devices(GPU_MEM)) + list(rig.kubelet.devices(GPU_CORE))
    assert all(len(i) <= 63 for i in ids)
    uuids = {g.uuid for g in rig.plugin.node.snapshot().inventory}
    assert {i.rsplit("-mem-", 1)[0] for i in rig.kubelet.devices(GPU_MEM)} == uuids


def test_stale_socket_file_is_replaced_and_other_files_are_left_alone(make_rig):
    rig = make_rig()
    rig.kubelet.start()
    stale = rig.kubelet.plugin_dir / SOCKET_NAMES[GPU_MEM]
    stale.write_text("left by a crashed plugin")
    rig.start()

    assert stat.S_ISSOCK(os.stat(stale).st_mode)
    assert (rig.kubelet.plugin_dir / "kubelet_internal_checkpoint").read_text() == "{}"
    assert (rig.kubelet.plugin_dir / "DEPRECATION").exists()


def test_kubelet_restart_is_followed_by_re_registration_on_the_new_socket(make_rig):
    """How fast is bench/deviceplugin_bench.py's figure; here: that it happens."""
    rig = make_rig().start()
    before = len(rig.kubelet.registrations)

    rig.kubelet.restart()
    assert rig.kubelet.wait_for(lambda: len(rig.kubelet.registrations) >= before + 2, WAIT)

    again = {r.resource for r in rig.kubelet.registrations[before:]}
    assert again == {GPU_MEM, GPU_COUNT}
    # Fresh servers on fresh sockets: the kubelet has the device lists again.
    assert rig.kubelet.wait_for(lambda: rig.kubelet.capacity(GPU_MEM) == (32, 32), WAIT)


def test_registration_waits_for_the_kubelet_and_happens_once_it_appears(make_rig, caplog):
    rig = make_rig()
    rig.kubelet.plugin_dir.mkdir(parents=True)
    plugin = rig.plugin = rig.new_plugin()
    with caplog.at_level(logging.WARNING, logger="gpushare.deviceplugin"):
        plugin.start()
        assert plugin.wait_synced(WAIT)
        assert eventually(lambda: "waiting for the kubelet: no" in caplog.text)
    # No kubelet.sock yet: the servers are up, nothing is registered.
    assert rig.kubelet.registrations == []
    assert plugin.registrar.registered() == ()

    rig.kubelet.start()
    rig.wait_registered([GPU_MEM, GPU_COUNT], timeout=WAIT)  # how fast: the benchmark
    assert plugin.registrar.registered() == (GPU_COUNT, GPU_MEM)


def test_only_the_first_message_is_sent_until_something_changes(make_rig):
    rig = make_rig().start()
    assert rig.kubelet.wait_for(lambda: rig.kubelet.messages(GPU_MEM) == 1, WAIT)
    time.sleep(0.3)  # a quiet period: nothing may be sent in it
    assert rig.kubelet.messages(GPU_MEM) == 1


class _Refused(grpc.RpcError):
    pass


def test_a_refused_registration_is_retried_after_growing_delays(make_rig, monkeypatch):
    tries: list[float] = []
    register = registration_module.register

    def refused_twice(socket, endpoint, resource, timeout):
        if resource == GPU_MEM:
            tries.append(time.monotonic())
            if len(tries) <= 2:
                raise _Refused("the kubelet is busy")
        register(socket, endpoint, resource, timeout)

    monkeypatch.setattr(registration_module, "register", refused_twice)
    rig = make_rig().start()  # waits until both resources are registered

    assert len(tries) == 3
    first, second = tries[1] - tries[0], tries[2] - tries[1]
    low = 1 - REGISTER_BACKOFF.jitter
    assert first >= REGISTER_BACKOFF.initial * low
    assert second >= REGISTER_BACKOFF.initial * REGISTER_BACKOFF.factor * low
    assert rig.plugin.registrar.registered() == (GPU_COUNT, GPU_MEM)
