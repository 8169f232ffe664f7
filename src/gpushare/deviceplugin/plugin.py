"""The device plugin of one node, assembled: GPUs from the backend, the node and
its pods from the cluster port, one gRPC server per advertised resource.

    backend ──health, GPUs found again──► LocalNode ◄──labels── node watch
                           │ (mode, health, catalog)
                           ├──► DeviceFeeds ──► ResourceServers (ListAndWatch)
                           ├──► InventoryPublisher (gpushare.io/gpus)
                           └──► Registrar (which resources are registered)
    pod watch ──► AdmissionQueue ◄── Allocator (Allocate, GetPreferredAllocation)
                                          ├──► AssignmentWriter (assigned=true)
                                          └──► GrantJournal ◄── Reconciler (PodResources)

The node and pod watches are `kubecluster.WatchCache`s, the extender's too, scoped to
this node: its own Node, and the pods bound to it.
"""

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpushare.backoff import Backoff
from gpushare.cluster import Cluster, EventType
from gpushare.deviceplugin.admission import AdmissionQueue
from gpushare.deviceplugin.allocator import Allocator
from gpushare.deviceplugin.assignment import AssignmentWriter
from gpushare.deviceplugin.deadline import ANSWER_WITHIN_S
from gpushare.deviceplugin.feed import DeviceFeed
from gpushare.deviceplugin.journal import FILE_NAME, GrantJournal
from gpushare.deviceplugin.metrics import PluginMetrics
from gpushare.deviceplugin.node import LocalNode, NodeChange, NodeSnapshot
from gpushare.deviceplugin.publisher import InventoryPublisher
from gpushare.deviceplugin.reconcile import Reconciler
from gpushare.deviceplugin.rediscovery import REDISCOVER_INTERVAL, Rediscovery
from gpushare.deviceplugin.registration import Registrar
from gpushare.deviceplugin.worker import start_daemon
from gpushare.gpunode.backends.port import DeviceBackend, HealthChange
from gpushare.gpunode.interposer import InterposerMounts
from gpushare.kubecluster.watchcache import WatchCache
from gpushare.objects import Node, Pod
from gpushare.resources import MANAGED_RESOURCES

log = logging.getLogger(__name__)

DEVICE_PLUGIN_DIR: Final = Path("/var/lib/kubelet/device-plugins")
POD_RESOURCES_SOCKET: Final = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
WATCH_BACKOFF: Final = Backoff(initial=0.5, maximum=10.0)
"""Between retries of a failing list or watch: a recovered API server is followed
again within seconds, and the jitter keeps a fleet of plugins from retrying in step."""
HEALTH_BACKOFF: Final = Backoff(initial=1.0, maximum=30.0)
"""Between retries of a failing GPU health watch (NVML)."""


@dataclass(frozen=True)
class PluginConfig:
    node_name: str
    plugin_dir: Path = DEVICE_PLUGIN_DIR
    pod_resources_socket: Path | None = POD_RESOURCES_SOCKET
    """None: no reconciliation with the kubelet's PodResources."""
    poll_interval: float = 0.1
    """Seconds between checks for a kubelet restart (re-registration within a second)."""
    reconcile_delay: float = 2.0
    reconcile_interval: float = 60.0
    answer_within: float = ANSWER_WITHIN_S
    """Seconds within which GetPreferredAllocation and Allocate are answered; a
    call that matches nothing waits that long for the pod watch to catch up."""
    interposer_dir: Path | None = None
    """The node's interposer directory (gpunode/interposer.py); None: never load
    the CUDA interposer into containers."""
    rediscover_interval: float = REDISCOVER_INTERVAL
    """Seconds between listings of the node's GPUs (rediscovery.py); 0: only at start."""


class DevicePlugin:
    def __init__(
        self,
        config: PluginConfig,
        backend: DeviceBackend,
        cluster: Cluster,
        metrics: PluginMetrics | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.cluster = cluster
        self.metrics = metrics or PluginMetrics(config.node_name)
        self.node = LocalNode(backend.discover())
        self.queue = AdmissionQueue(config.node_name)
        self.feeds = {resource: DeviceFeed(resource) for resource in MANAGED_RESOURCES}
        self.journal = GrantJournal(config.plugin_dir / FILE_NAME)
        self.assignments = AssignmentWriter(cluster)
        self.inventory = InventoryPublisher(cluster, config.node_name)
        interposer = InterposerMounts(config.interposer_dir) if config.interposer_dir else None
        self.reconciler = (
            Reconciler(
                config.pod_resources_socket,
                self.queue,
                self.journal,
                self.assignments,
                cluster,
                self.metrics,
                config.reconcile_delay,
                config.reconcile_interval,
                ready=lambda: self._pod_watch.synced.is_set(),
                interposer=interposer,
            )
            if config.pod_resources_socket is not None
            else None
        )
        self.allocator = Allocator(
            self.node,
            self.queue,
            backend,
            self.assignments,
            self.journal,
            self.metrics,
            on_granted=self.reconciler.poke if self.reconciler else lambda: None,
            answer_within=config.answer_within,
            watch_trouble=self.watch_trouble,
            interposer=interposer,
        )
        self.registrar = Registrar(
            config.plugin_dir,
            self.feeds,
            self.allocator,
            lambda: self.node.snapshot().advertised,
            self.metrics,
            config.poll_interval,
        )
        # Only its own Node: with every node's heartbeats, N plugins would make the API
        # server stream N x N updates.
        self._node_watch = WatchCache(
            "nodes",
            lambda: cluster.list_nodes(config.node_name),
            lambda rv: cluster.watch_nodes(rv, config.node_name),
            _OwnNode(self),
            backoff=WATCH_BACKOFF,
        )
        self._pod_watch = WatchCache(
            "pods",
            lambda: cluster.list_pods(config.node_name),
            lambda rv: cluster.watch_pods(rv, config.node_name),
            _OwnPods(self),
            backoff=WATCH_BACKOFF,
        )
        self.rediscovery = Rediscovery(
            backend,
            self.node.update_gpus,
            lambda: {i for _, a in self.queue.bound_pods() for i in a.gpu_indices},
            config.rediscover_interval,
        )
        self._stopped = threading.Event()
        self._health_round = threading.Event()
        """Set to end the current health watch: at stop, or when the GPUs changed (a new
        watch then follows the new list)."""
        self._health_thread: threading.Thread | None = None
        self._rediscovery_thread: threading.Thread | None = None
        self.node.subscribe(self._on_node_change)
        self.metrics.watch_gpus(lambda: self.node.snapshot().inventory, self.queue.bound_pods)

    def start(self) -> None:
        snapshot = self.node.snapshot()
        self._publish_feeds(snapshot)
        self.inventory.start()
        self.inventory.publish(snapshot.inventory)
        self.assignments.start()
        self.allocator.follow_ups.start()
        self._node_watch.start()
        self._pod_watch.start()
        self._health_thread = start_daemon("gpu-health", self._watch_health)
        if self.config.rediscover_interval > 0:
            self._rediscovery_thread = start_daemon(
                "gpu-rediscovery", lambda: self.rediscovery.run(self._stopped)
            )
        self.registrar.start()
        if self.reconciler is not None:
            self.reconciler.start()

    def stop(self) -> None:
        self._stopped.set()
        self._health_round.set()
        self.registrar.stop()
        self.allocator.follow_ups.stop()
        if self.reconciler is not None:
            self.reconciler.stop()
        self._pod_watch.stop()
        self._node_watch.stop()
        self.assignments.stop()
        self.inventory.stop()
        self.journal.close()
        for thread in (self._health_thread, self._rediscovery_thread):
            if thread is not None:
                thread.join(timeout=5)

    def wait_synced(self, timeout: float) -> bool:
        """True once the node and its pods were listed."""
        return self._node_watch.synced.wait(timeout) and self._pod_watch.synced.wait(timeout)

    def watch_trouble(self) -> str | None:
        """Why the plugin's list of the node's pods may be stale (the pod watch is
        failing, or its thread died); None while the watch is followed."""
        return self._pod_watch.trouble()

    def summary(self) -> str:
        gpus = self.node.snapshot().inventory
        layout = ", ".join(f"{g.index}:{g.model} {g.mem}GiB" for g in gpus) or "none"
        return (
            f"node={self.config.node_name} backend={self.backend.name} gpus=[{layout}] "
            f"device-plugin-dir={self.config.plugin_dir} "
            f"pod-resources-socket={self.config.pod_resources_socket or 'off'} "
            f"allocate-timeout={self.config.answer_within:g}s "
            f"interposer-dir={self.config.interposer_dir or 'off'} "
            f"rediscover-interval={self.config.rediscover_interval:g}s"
        )

    # ----- reactions

    def _watch_health(self) -> None:
        failures = 0
        while not self._stopped.is_set():
            started = time.monotonic()
            self._health_round = watching = threading.Event()
            if self._stopped.is_set():  # stop() may have set the round before this one
                return
            try:
                self.backend.watch_health(self._on_health, watching)
            except Exception:
                # One that ran a good while before failing starts a new count.
                ran_long = time.monotonic() - started > HEALTH_BACKOFF.maximum
                failures = 1 if ran_long else failures + 1
                delay = HEALTH_BACKOFF.delay(failures)
                log.exception("watching GPU health failed; trying again in %.1fs", delay)
                self._stopped.wait(delay)

    def _on_health(self, change: HealthChange) -> None:
        if self.node.set_health(change):
            state = "healthy again" if change.healthy else "unhealthy"
            log.warning("GPU %d is %s: %s", change.index, state, change.reason)

    def _on_node_change(self, snapshot: NodeSnapshot, change: NodeChange) -> None:
        self._publish_feeds(snapshot)
        self.metrics.missing_gpus(self.rediscovery.missing)
        if change is NodeChange.GPUS:
            self._health_round.set()  # the watch follows the GPUs it started with
        if change is not NodeChange.LABELS:
            self.inventory.publish(snapshot.inventory)
        else:
            log.info(
                "node mode is %s: advertising %s",
                snapshot.mode or "unset",
                ", ".join(snapshot.advertised) or "nothing",
            )
        self.registrar.wake()

    def _publish_feeds(self, snapshot: NodeSnapshot) -> None:
        for resource, feed in self.feeds.items():
            devices = snapshot.catalog.devices(resource) if resource in snapshot.advertised else []
            feed.publish(devices)
            self.metrics.advertised(resource, sum(1 for d in devices if d.healthy))


class _OwnNode:
    """What the node watch learns about this node: its labels (the mode)."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self._plugin = plugin
        self._name = plugin.config.node_name

    def replace(self, items: list[Node]) -> None:
        nodes = [node for node in items if node.name == self._name]
        if not nodes:
            log.warning(
                "node %s is not in the cluster; advertising nothing until it appears "
                "(is --node-name / NODE_NAME right?)",
                self._name,
            )
        self._plugin.node.set_labels(nodes[0].metadata.labels if nodes else {})

    def apply(self, event_type: EventType, node: Node) -> None:
        if node.name == self._name:
            deleted = event_type is EventType.DELETED
            self._plugin.node.set_labels({} if deleted else node.metadata.labels)


class _OwnPods:
    """What the pod watch learns about the pods bound to this node: the queue that
    Allocate matches against, and which grants the journal keeps."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self._queue = plugin.queue
        self._journal = plugin.journal

    def replace(self, items: list[Pod]) -> None:
        self._queue.replace(items)
        self._journal.keep_pods(self._queue.uids())

    def apply(self, event_type: EventType, pod: Pod) -> None:
        if event_type is EventType.DELETED:
            self._queue.remove(pod)
            self._journal.keep_pods(self._queue.uids())
        else:
            self._queue.upsert(pod)
