"""Registration with the kubelet's plugin watcher over real sockets (DRA-INTERFACES §1)."""

import logging
import os
import stat
from pathlib import Path

import grpc

from gpushare.draplugin.registration import (
    SUPPORTED_VERSIONS,
    RegistrationServer,
    registration_socket,
)
from gpushare.draplugin.server import DraServer, PrepareResult
from gpushare.kubeletapi.pluginregistration.v1 import api_pb2 as reg
from gpushare.kubeletapi.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from tests.draplugin.rig import DRIVER, WAIT, ScriptedPreparer, eventually


def _get_info(socket) -> reg.PluginInfo:
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        return reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=WAIT)


def test_get_info_names_the_driver_its_dra_socket_and_v1_first(node):
    node.start_driver()
    socket = node.registry / "gpu.gpushare.io-reg.sock"
    assert registration_socket(node.registry, DRIVER) == socket

    info = _get_info(socket)

    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(node.root / "plugins" / DRIVER / "dra.sock")
    assert os.path.isabs(info.endpoint) and stat.S_ISSOCK(os.stat(info.endpoint).st_mode)
    # DRAPlugin versions first (the kubelet takes the first it knows), then the
    # optional health stream (DRA-INTERFACES §1).
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1alpha1.DRAResourceHealth",
    ]
    assert list(SUPPORTED_VERSIONS) == list(info.supported_versions)


def test_both_sockets_are_for_the_owner_only(node):
    node.start_driver()
    for socket in (node.registration.socket_path, node.dra.socket_path):
        assert stat.S_IMODE(os.stat(socket).st_mode) == 0o600


def test_a_stale_file_at_the_socket_path_is_replaced(node):
    node.registry.mkdir(parents=True)
    node.registration.socket_path.write_text("left by a crashed driver")
    node.start_driver()
    assert _get_info(node.registration.socket_path).name == DRIVER


def test_a_current_kubelet_registers_the_driver_with_v1(node):
    kubelet = node.started()

    assert kubelet.registered() == {DRIVER: "v1.DRAPlugin"}
    assert node.registration.registered.wait(WAIT)
    assert node.registration.last_error == ""
    [registration] = kubelet.registrations
    assert registration.endpoint == str(node.dra.socket_path)


def test_a_1_34_kubelet_picks_v1beta1(node):
    kubelet = node.started(versions=("v1beta1.DRAPlugin",))
    assert kubelet.registered() == {DRIVER: "v1beta1.DRAPlugin"}
    assert node.registration.registered.wait(WAIT)


def test_the_kubelet_takes_the_plugins_first_entry_it_knows(node, monkeypatch):
    offered = node.registration.info()
    del offered.supported_versions[:]
    offered.supported_versions.extend(["v9.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAPlugin"])
    monkeypatch.setattr(node.registration, "info", lambda: offered)

    kubelet = node.started()

    assert kubelet.registered() == {DRIVER: "v1beta1.DRAPlugin"}


def test_a_relative_dra_socket_path_is_advertised_absolute(short_tmp, monkeypatch):
    monkeypatch.chdir(short_tmp)
    registration = RegistrationServer(short_tmp / "registry", DRIVER, Path("plugins/dra.sock"))
    assert registration.info().endpoint == str(short_tmp / "plugins" / "dra.sock")


def test_a_kubelet_knowing_no_offered_version_refuses_and_the_driver_records_why(node, caplog):
    node.start_driver()
    with caplog.at_level(logging.WARNING, logger="gpushare.draplugin"):
        kubelet = node.start_kubelet(versions=())
        assert eventually(lambda: node.registration.last_error != "")

    assert "v1.DRAPlugin" in node.registration.last_error
    assert not node.registration.registered.is_set()
    assert kubelet.registered() == {}
    assert kubelet.refusals[0] == (node.registration.socket_path.name, node.registration.last_error)
    assert node.registration.last_error in caplog.text


def test_a_refusal_after_acceptance_clears_registered(node):
    node.started()
    assert node.registration.registered.wait(WAIT)
    with grpc.insecure_channel(f"unix:{node.registration.socket_path}") as channel:
        reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=False, error="kubelet shutting down"),
            timeout=WAIT,
        )
    assert not node.registration.registered.is_set()
    assert node.registration.last_error == "kubelet shutting down"


def test_removing_the_socket_deregisters(node):
    kubelet = node.started()

    node.registration.stop()

    assert not node.registration.socket_path.exists()
    assert kubelet.wait_for(lambda: kubelet.registered() == {}, WAIT)


def test_hidden_sockets_and_plain_files_are_ignored(node):
    node.start_driver()
    hidden = node.registry / ".gpu.gpushare.io-reg.sock"
    os.rename(node.registration.socket_path, hidden)  # still our server, under a dot name
    (node.registry / "notes.txt").write_text("not a socket")
    kubelet = node.start_kubelet()

    assert not kubelet.wait_for(lambda: bool(kubelet.registered()), 0.3)
    assert kubelet.refusals == []

    os.rename(hidden, node.registration.socket_path)
    assert kubelet.wait_for(lambda: kubelet.registered() == {DRIVER: "v1.DRAPlugin"}, WAIT)


def test_the_newest_plugin_of_a_driver_serves_it_until_it_goes(node, short_tmp):
    """A rolling update: a second plugin of the driver registers beside the first (§1)."""
    kubelet = node.started()
    newer = ScriptedPreparer()
    dra = DraServer(node.root / "plugins" / DRIVER / "dra-new.sock", newer)
    dra.start()
    elsewhere = RegistrationServer(short_tmp / "staging", DRIVER, dra.socket_path)
    elsewhere.start()
    second = node.registry / f"{DRIVER}-new-reg.sock"
    os.rename(elsewhere.socket_path, second)
    try:
        assert kubelet.wait_for(lambda: len(kubelet.plugins()) == 2, WAIT)
        first_claim = node.claim("first", pods=["pod-1"])
        newer.results[first_claim.uid] = PrepareResult()
        kubelet.prepare("pod-1", [first_claim])
        assert [len(calls) for calls in (newer.prepared, node.preparer.prepared)] == [1, 0]

        second.unlink()
        assert kubelet.wait_for(lambda: len(kubelet.plugins()) == 1, WAIT)
        old_claim = node.claim("second", pods=["pod-2"])
        node.preparer.results[old_claim.uid] = PrepareResult()
        kubelet.prepare("pod-2", [old_claim])
        assert [len(calls) for calls in (newer.prepared, node.preparer.prepared)] == [1, 1]
    finally:
        elsewhere.stop()
        dra.stop(grace=0)
