"""The node's mode label on a live node: resources come and go without a restart."""

import logging

from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.environment import POD
from gpushare.inventory import parse_layout
from gpushare.labels import LABEL_DISABLE_ISOLATION, LABEL_LEGACY_SHARE, LABEL_SCHEDULE
from gpushare.resources import GPU_CORE, GPU_COUNT, GPU_MEM, MANAGED_RESOURCES
from tests.deviceplugin.rig import WAIT, eventually


def test_cgpu_to_core_mem_adds_the_core_resource(make_rig):
    rig = make_rig(layout="2x16GiB", mode="cgpu").start()
    first = len(rig.kubelet.registrations)

    rig.cluster.set_node_labels(rig.node, {LABEL_SCHEDULE: "core_mem"})

    rig.wait_registered([GPU_MEM, GPU_COUNT, GPU_CORE])
    assert rig.kubelet.capacity(GPU_CORE) == (200, 200)
    # The memory and count registrations were kept, not redone.
    assert [r.resource for r in rig.kubelet.registrations[first:]] == [GPU_CORE]


def test_removing_the_label_withdraws_every_resource_with_an_empty_list_first(make_rig):
    rig = make_rig(layout="2x16GiB", mode="core_mem").start()

    rig.cluster.set_node_labels(rig.node, {LABEL_SCHEDULE: None})

    # Capacity drops to zero at once (the last list is empty) and the streams end.
    for resource in (GPU_MEM, GPU_COUNT, GPU_CORE):
        assert rig.kubelet.wait_for(lambda r=resource: rig.kubelet.capacity(r) == (0, 0), WAIT)
    assert rig.kubelet.wait_for(lambda: rig.kubelet.registered() == set(), WAIT)
    assert rig.plugin.registrar.registered() == ()
    assert not list(rig.kubelet.plugin_dir.glob("gpushare-*.sock"))


def test_core_mem_back_to_cgpu_withdraws_only_the_core_resource(make_rig):
    rig = make_rig(layout="1x16GiB", mode="core_mem").start()

    rig.cluster.set_node_labels(rig.node, {LABEL_SCHEDULE: "cgpu"})

    rig.wait_registered([GPU_MEM, GPU_COUNT])
    assert rig.kubelet.capacity(GPU_MEM) == (16, 16)


def test_labelling_an_unlabelled_node_registers_its_resources(make_rig):
    rig = make_rig(mode=None).start()
    assert rig.kubelet.registrations == []

    rig.cluster.set_node_labels(rig.node, {LABEL_LEGACY_SHARE: "true"})

    rig.wait_registered([GPU_MEM, GPU_COUNT])


def test_mode_and_isolation_label_change_the_environment_of_later_containers(make_rig):
    rig = make_rig(layout="1x16GiB", mode="cgpu").start()
    first = rig.bind("first", [[0]], mem=2)
    [isolated] = rig.kubelet.admit(first)
    assert "CGPU_DISABLE" not in isolated.envs

    rig.cluster.set_node_labels(rig.node, {LABEL_DISABLE_ISOLATION: "true"})
    assert eventually(lambda: rig.plugin.node.snapshot().isolation_disabled)
    second = rig.bind("second", [[0]], mem=2)
    [unisolated] = rig.kubelet.admit(second)
    assert unisolated.envs["CGPU_DISABLE"] == "true"

    rig.cluster.set_node_labels(rig.node, {LABEL_DISABLE_ISOLATION: None, LABEL_SCHEDULE: "share"})
    assert eventually(lambda: rig.plugin.node.snapshot().mode == "share")
    third = rig.bind("third", [[0]], mem=2)
    [shared] = rig.kubelet.admit(third)
    assert shared.envs["CGPU_DISABLE"] == "true"


def test_an_unlabelled_node_says_why_it_advertises_nothing(make_rig, caplog):
    with caplog.at_level(logging.INFO, logger="gpushare.deviceplugin"):
        rig = make_rig(mode=None).start()

    assert "node mode is unset: advertising nothing" in caplog.text
    advertised = "gpushare_device_plugin_advertised_devices"
    values = [rig.plugin.metrics.value(advertised, resource=r) for r in MANAGED_RESOURCES]
    assert values == [0, 0, 0]


def test_a_wrong_node_name_is_reported_and_nothing_is_advertised(make_rig, caplog):
    rig = make_rig()
    rig.node = "not-this-one"
    with caplog.at_level(logging.WARNING, logger="gpushare.deviceplugin"):
        rig.start()

    assert "node not-this-one is not in the cluster" in caplog.text
    assert rig.kubelet.registrations == []


class NodeEventCounter(MemoryCluster):
    """Counts the node events each node watch delivers."""

    def __init__(self) -> None:
        super().__init__()
        self.delivered: list[str] = []

    def watch_nodes(self, resource_version: str, name: str | None = None):
        watch = super().watch_nodes(resource_version, name)
        delivered = self.delivered

        class Counting:
            def __iter__(self):
                for event in watch:
                    delivered.append(event.object.name)
                    yield event

            @property
            def resume_from(self) -> str:
                return watch.resume_from

            def stop(self) -> None:
                watch.stop()

        return Counting()


def test_the_plugin_hears_only_its_own_node(make_rig):
    """With every node's heartbeat, N plugins would make the API server send N x N node
    updates; each plugin lists and watches its own Node only."""
    rig = make_rig(layout="1x16GiB", mode="cgpu", cluster_type=NodeEventCounter).start()
    others = [f"other-{i}" for i in range(20)]
    for name in others:
        rig.cluster.add_node(gpu_node(name, parse_layout("1x16GiB", name), mode="cgpu"))
    for name in others:
        rig.cluster.set_node_labels(name, {"heartbeat": "1"})
    rig.cluster.set_node_labels(rig.node, {LABEL_SCHEDULE: "core_mem"})

    rig.wait_registered([GPU_MEM, GPU_COUNT, GPU_CORE])
    assert set(rig.cluster.delivered) == {rig.node}
    assert rig.cluster.list_nodes(rig.node).items[0].name == rig.node


class ListCounter(MemoryCluster):
    """Counts the lists of pods and can end every pod watch, as the API server does
    when a watch's timeout passes."""

    def __init__(self) -> None:
        super().__init__()
        self.pod_lists = 0
        self.pod_watches: list = []

    def list_pods(self, node_name: str | None = None):
        self.pod_lists += 1
        return super().list_pods(node_name)

    def watch_pods(self, resource_version: str, node_name: str | None = None):
        watch = super().watch_pods(resource_version, node_name)
        self.pod_watches.append(watch)
        return watch

    def end_watches(self) -> None:
        for watch in self.pod_watches:
            watch.stop()


def test_a_watch_the_server_ends_is_resumed_without_listing_again(make_rig):
    rig = make_rig(cluster_type=ListCounter, answer_within=WAIT).start()
    assert rig.cluster.pod_lists == 1
    rig.cluster.end_watches()
    pod = rig.bind("after", [[0]], mem=2)

    [main] = rig.kubelet.admit(pod)
    assert main.envs[POD] == pod.key
    assert rig.cluster.pod_lists == 1
    assert len(rig.cluster.pod_watches) == 2
