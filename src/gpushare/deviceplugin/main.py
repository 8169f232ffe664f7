"""`gpushare-device-plugin`: the kubelet device plugin of one GPU node.

Advertises aliyun.com/gpu-mem, aliyun.com/gpu-count and (core_mem nodes)
aliyun.com/gpu-core.percentage to the kubelet, following the node label
ack.node.gpu.schedule, and answers each container's Allocate with the GPU
slice the gpushare scheduler extender chose for it.
"""

import argparse
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from gpushare.cluster import Cluster
from gpushare.commandline import add_version_flag, exit_status
from gpushare.deviceplugin.deadline import ANSWER_WITHIN_S
from gpushare.deviceplugin.metrics import PluginMetrics
from gpushare.deviceplugin.plugin import (
    DEVICE_PLUGIN_DIR,
    POD_RESOURCES_SOCKET,
    DevicePlugin,
    PluginConfig,
)
from gpushare.deviceplugin.rediscovery import REDISCOVER_INTERVAL
from gpushare.gpunode.backendflags import add_backend_flags, build_backend
from gpushare.gpunode.backends.nvml import NvmlBackend
from gpushare.gpunode.backends.port import DeviceBackend
from gpushare.nodeflags import add_node_flags, check_node_flags
from gpushare.nodeflags.serving import start_metrics

log = logging.getLogger("gpushare.deviceplugin")

METRICS_PORT: Final = 9401
"""The isolation agent's is 9402: both listen in the node pod's one network namespace."""


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="gpushare-device-plugin",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_node_flags(parser, METRICS_PORT)
    add_backend_flags(parser)
    parser.add_argument(
        "--device-plugin-dir",
        type=Path,
        default=DEVICE_PLUGIN_DIR,
        help="the kubelet's device plugin directory (holds kubelet.sock and our sockets)",
    )
    parser.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=POD_RESOURCES_SOCKET,
        help="the kubelet's PodResources socket, read to confirm allocations",
    )
    parser.add_argument(
        "--allocate-timeout",
        type=float,
        metavar="SECONDS",
        default=ANSWER_WITHIN_S,
        help="the kubelet's GetPreferredAllocation and Allocate have no deadline, and it "
        "admits one pod at a time: each call is answered within this many seconds. An "
        "Allocate whose pod the API watch has not shown by then is refused (the pod fails "
        "with UnexpectedAdmissionError and its controller makes another)",
    )
    parser.add_argument(
        "--rediscover-interval",
        type=float,
        metavar="SECONDS",
        default=REDISCOVER_INTERVAL,
        help="list the node's GPUs again this often: a GPU added is advertised, one gone "
        "is withdrawn (kept, Unhealthy, while pods hold it), without a restart; 0 lists "
        "them only at start",
    )
    parser.add_argument(
        "--kubeconfig",
        default=env.get("KUBECONFIG", ""),
        help="kubeconfig file; empty means in-cluster credentials (env KUBECONFIG)",
    )
    add_version_flag(parser)
    return parser


def run(args: argparse.Namespace, cluster: Cluster, stop: threading.Event) -> int:
    """Runs the plugin until `stop` is set; 1 when the GPUs cannot be read."""
    try:
        if not args.allocate_timeout > 0:
            raise ValueError(f"--allocate-timeout must be above 0, got {args.allocate_timeout:g}")
        if not args.rediscover_interval >= 0:
            raise ValueError(
                f"--rediscover-interval must be 0 or more, got {args.rediscover_interval:g}"
            )
        backend = build_backend(args)
        config = PluginConfig(
            node_name=args.node_name,
            plugin_dir=args.device_plugin_dir,
            pod_resources_socket=args.pod_resources_socket,
            answer_within=args.allocate_timeout,
            interposer_dir=args.interposer_dir,
            rediscover_interval=args.rediscover_interval,
        )
        metrics = PluginMetrics(args.node_name)
        plugin = DevicePlugin(config, backend, cluster, metrics)
    except (ValueError, RuntimeError) as err:
        log.error("gpushare-device-plugin cannot start: %s", err)
        return 1
    log.info(
        "gpushare-device-plugin starting: %s gpu-memory-rounding=%s%s metrics-port=%s log-level=%s",
        plugin.summary(),
        args.gpu_memory_rounding,
        _device_files(backend),
        args.metrics_port or "off",
        args.log_level,
    )
    if not start_metrics(args.metrics_port, metrics.registry, log):
        return 1
    plugin.start()
    threading.Thread(target=_freeze_when_synced, args=(plugin, stop), daemon=True).start()
    stop.wait()
    log.info("stopping")
    plugin.stop()
    return 0


def _device_files(backend: DeviceBackend) -> str:
    """The dev root and the control device files seen there, for the start line; a
    warning when nvidiactl is not among them (every CUDA container needs it)."""
    if not isinstance(backend, NvmlBackend):
        return ""
    found = backend.control_devices()
    if "nvidiactl" not in found:
        log.warning(
            "no nvidiactl under --dev-root %s: GPU containers get only their /dev/nvidiaN "
            "from the plugin; is the node's /dev mounted there?",
            backend.dev_root,
        )
    return f" dev-root={backend.dev_root} control-devices={','.join(found) or 'none'}"


def _freeze_when_synced(plugin: DevicePlugin, stop: threading.Event) -> None:
    """Once the node and its pods are listed, keeps everything made so far (modules,
    the API client, the listed pods) out of the garbage collector's full passes: such
    a pass otherwise walks all of it and stalls an Allocate for milliseconds."""
    while not stop.is_set():
        if plugin.wait_synced(1.0):
            gc.freeze()
            log.info(
                "synced: node and pods listed; %d objects kept out of full collections",
                gc.get_freeze_count(),
            )
            return


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_node_flags(parser, args)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return exit_status(parser, lambda: _serve(args))


def _serve(args: argparse.Namespace) -> int:
    from gpushare.kubecluster import KubeCluster  # the Kubernetes API adapter, only in production

    cluster = KubeCluster.from_config(args.kubeconfig or None)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return run(args, cluster, stop)


if __name__ == "__main__":
    sys.exit(main())
