"""gpushare-dra-plugin: the node's GPUs through Dynamic Resource Allocation (docs/dra.md).

Registers with the kubelet as DRA driver gpu.gpushare.io, publishes the node's GPUs as
one ResourceSlice, and prepares the claims the scheduler allocated on them: the same
environment, CUDA interposer and device files a container gets from the device plugin,
through CDI. Run it on nodes labelled gpushare.io/driver=dra, never beside the device
plugin on one node (both would hand out the same GPUs).
"""

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpushare.cluster import Cluster, ClusterError, DraCluster
from gpushare.commandline import add_version_flag, exit_status
from gpushare.draplugin.books import PreparedClaims
from gpushare.draplugin.health import HealthService
from gpushare.draplugin.metrics import DriverMetrics
from gpushare.draplugin.node import DriverNode
from gpushare.draplugin.preparer import Preparer
from gpushare.draplugin.publisher import SlicePublisher
from gpushare.draplugin.registration import RegistrationServer
from gpushare.draplugin.server import DraServer, dra_socket
from gpushare.gpunode.backendflags import add_backend_flags, build_backend
from gpushare.gpunode.backends.port import DeviceBackend
from gpushare.gpunode.interposer import InterposerMounts
from gpushare.nodeflags import add_node_flags, check_node_flags
from gpushare.nodeflags.serving import start_metrics
from gpushare.resources import GPU_MEM, RESOURCE

log = logging.getLogger("gpushare.draplugin")

METRICS_PORT: Final = 9403
KUBELET_ROOT: Final = Path("/var/lib/kubelet")
CDI_DIR: Final = Path("/var/run/cdi")
STATE_DIR: Final = Path("/var/lib/gpushare/dra")
DRIVER_NAME: Final = "gpu.gpushare.io"


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="gpushare-dra-plugin",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_node_flags(parser, METRICS_PORT)
    parser.add_argument(
        "--kubelet-root",
        type=Path,
        default=KUBELET_ROOT,
        help="the kubelet's root directory: the driver registers in its plugins_registry "
        "and serves the DRA API at plugins/gpu.gpushare.io/dra.sock",
    )
    parser.add_argument(
        "--cdi-dir",
        type=Path,
        default=CDI_DIR,
        help="where the container runtime reads CDI specs; one is written per prepared "
        "claim and request",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=STATE_DIR,
        help="where the record of prepared claims is kept across restarts",
    )
    parser.add_argument(
        "--sharing",
        choices=("on", "off"),
        default="on",
        help="on: GPUs of sharing nodes are published shareable (consumable capacity; needs "
        "feature gate DRAConsumableCapacity, on by default from Kubernetes 1.36); off: "
        "every GPU is one whole device",
    )
    add_backend_flags(parser)
    parser.add_argument(
        "--kubeconfig",
        default=env.get("KUBECONFIG", ""),
        help="kubeconfig file; empty means in-cluster credentials (env KUBECONFIG)",
    )
    add_version_flag(parser)
    return parser


@dataclass
class Driver:
    """The driver's parts, wired; `start` and `stop` them together."""

    node: DriverNode
    publisher: SlicePublisher
    server: DraServer
    registration: RegistrationServer
    backend: DeviceBackend
    cluster: Cluster
    stop_event: threading.Event
    metrics: DriverMetrics

    def start(self) -> None:
        self.node.set_gpus(self.backend.discover())
        self.publisher.start()
        self.server.start()
        self.registration.start()
        threading.Thread(
            target=self.backend.watch_health,
            args=(self.node.health_changed, self.stop_event),
            name="gpu-health",
            daemon=True,
        ).start()

    def stop(self) -> None:
        self.stop_event.set()
        self.registration.stop()
        self.server.stop()
        self.publisher.stop()


def build(
    args: argparse.Namespace, cluster: Cluster, dra: DraCluster, backend: DeviceBackend
) -> Driver:
    node = DriverNode(args.node_name)
    books = PreparedClaims(args.state_dir, args.cdi_dir)
    books.load()
    metrics = DriverMetrics(args.node_name, books.held)
    publisher = SlicePublisher(
        node,
        cluster,
        dra,
        sharing=args.sharing == "on",
        refresh=lambda: refresh(cluster, backend, node),
        metrics=metrics,
    )
    node.on_change(publisher.wake)
    interposer = InterposerMounts(args.interposer_dir) if args.interposer_dir else None
    preparer = Preparer(node, cluster, dra, books, backend, args.cdi_dir, interposer, metrics)
    socket = dra_socket(args.kubelet_root / "plugins", DRIVER_NAME)
    server = DraServer(socket, preparer, HealthService(node))
    registration = RegistrationServer(args.kubelet_root / "plugins_registry", DRIVER_NAME, socket)
    return Driver(
        node, publisher, server, registration, backend, cluster, threading.Event(), metrics
    )


def follow_node(cluster: Cluster, node: DriverNode) -> None:
    """Reads the Node: its UID owns the slice, its labels give the mode."""
    name = node.snapshot().name
    try:
        found = cluster.get_node(name)
    except ClusterError as err:
        log.warning("node %s cannot be read: %s", name, err)
        return
    node.set_node(found.metadata.uid, found.metadata.labels)


def refresh(cluster: Cluster, backend: DeviceBackend, node: DriverNode) -> None:
    """What the publisher reads again at each resync: the Node and the GPUs."""
    follow_node(cluster, node)
    rediscover(backend, node)


def rediscover(backend: DeviceBackend, node: DriverNode) -> None:
    """Lists the node's GPUs again: one added is published, one gone leaves the slice
    (its claims keep what they hold). A failed listing keeps the GPUs known."""
    try:
        node.set_gpus(backend.discover())
    except RuntimeError as err:
        log.warning("the node's GPUs cannot be listed again: %s", err)


def device_plugin_present(kubelet_root: Path) -> Path | None:
    """The device plugin's socket where it serves this node: both would hand out the same
    GPUs, so the driver refuses to start beside it."""
    socket = kubelet_root / "device-plugins" / RESOURCE[GPU_MEM].socket
    return socket if socket.exists() else None


def run(args: argparse.Namespace, cluster: Cluster, dra: DraCluster, stop: threading.Event) -> int:
    other = device_plugin_present(args.kubelet_root)
    if other is not None:
        log.error(
            "gpushare-dra-plugin cannot start: the gpushare device plugin serves this node (%s). "
            "A node runs one of the two: label it gpushare.io/driver=dra and let the chart move "
            "it (docs/dra.md#migrating-a-node)",
            other,
        )
        return 1
    try:
        driver = build(args, cluster, dra, build_backend(args))
    except (ValueError, RuntimeError, OSError) as err:
        log.error("gpushare-dra-plugin cannot start: %s", err)
        return 1
    if not start_metrics(args.metrics_port, driver.metrics.registry, log):
        return 1
    try:
        driver.start()
    except (ValueError, RuntimeError, OSError) as err:
        log.error("gpushare-dra-plugin cannot start: %s", err)
        return 1
    log.info(
        "gpushare-dra-plugin %s on node %s: %d GPU(s), sharing %s, CDI in %s",
        DRIVER_NAME,
        args.node_name,
        len(driver.node.snapshot().physical),
        args.sharing,
        args.cdi_dir,
    )
    stop.wait()
    driver.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_node_flags(parser, args)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return exit_status(parser, lambda: _serve(args))


def _serve(args: argparse.Namespace) -> int:
    from gpushare.kubecluster import KubeCluster  # the Kubernetes API adapter, only in production

    cluster = KubeCluster.from_config(args.kubeconfig or None)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return run(args, cluster, cluster, stop)


if __name__ == "__main__":
    sys.exit(main())
