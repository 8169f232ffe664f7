"""The demo's admission stage: the real plugin on mock GPUs, driven over its real
gRPC sockets by the kubelet stand-in, so each container's environment comes
from Allocate exactly as a real kubelet would hand it to the runtime."""

import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpushare import annotation
from gpushare.cluster import Cluster
from gpushare.deviceplugin.plugin import DevicePlugin, PluginConfig
from gpushare.environment import CGPU_DISABLE, CORE_PERCENTAGE, NVIDIA_VISIBLE_DEVICES
from gpushare.gpunode.backends.mock import MockBackend
from gpushare.objects import Pod
from gpushare.standins.kubelet import KubeletStandIn

READY_TIMEOUT: Final = 10.0
SHOWN_PREFIXES: Final = ("ALIYUN_COM_GPU_", NVIDIA_VISIBLE_DEVICES, CGPU_DISABLE, CORE_PERCENTAGE)


@dataclass(frozen=True, slots=True)
class ContainerEnvironment:
    node: str
    pod: str
    container: str
    init: bool
    env: Mapping[str, str]


def admit_bound_pods(cluster: Cluster, layouts: Mapping[str, str]) -> list[ContainerEnvironment]:
    """Admits every pod bound to the nodes in `layouts` (node -> mock GPU layout),
    oldest binding first, through a plugin and a kubelet stand-in per node."""
    admitted: list[ContainerEnvironment] = []
    with tempfile.TemporaryDirectory(prefix="gpushare-demo-") as tmp:
        for node, layout in sorted(layouts.items()):
            pods = _bound_pods(cluster, node)
            if pods:
                admitted += _admit_on(cluster, node, layout, pods, Path(tmp) / node)
    return admitted


def render(admitted: list[ContainerEnvironment]) -> str:
    lines = ["Kubelet admission through the device plugin (real gRPC on unix sockets):"]
    for entry in admitted:
        role = " (init)" if entry.init else ""
        lines.append(f"  {entry.node} {entry.pod} container {entry.container}{role}:")
        for key in sorted(entry.env):
            if key.startswith(SHOWN_PREFIXES):
                lines.append(f"    {key}={entry.env[key]}")
    return "\n".join(lines)


def _bound_pods(cluster: Cluster, node: str) -> list[Pod]:
    placed = []
    for pod in cluster.list_pods(node).items:
        allocation = annotation.decode(pod)
        # The kubelet starts no container of a pod being deleted.
        if allocation is not None and not pod.is_finished and not pod.is_deleting:
            placed.append((allocation.bound_at, pod.key, pod))
    return [pod for _, _, pod in sorted(placed, key=lambda item: item[:2])]


def _admit_on(
    cluster: Cluster, node: str, layout: str, pods: list[Pod], workdir: Path
) -> list[ContainerEnvironment]:
    kubelet = KubeletStandIn(workdir / "device-plugins", workdir / "pod-resources.sock")
    plugin = DevicePlugin(
        PluginConfig(node, kubelet.plugin_dir, kubelet.pod_resources_socket, reconcile_delay=0.1),
        MockBackend.from_layout(layout, node),
        cluster,
    )
    kubelet.start()
    plugin.start()
    try:
        if not plugin.wait_synced(READY_TIMEOUT):
            raise RuntimeError(f"device plugin of {node} did not see its node and pods")
        wanted = plugin.node.snapshot().advertised
        # A kubelet admits pods only against the devices a plugin's ListAndWatch has
        # sent, which comes after Register; on a real cluster the scheduler sees the
        # node's capacity only then. Admitting on registration alone raced that first
        # list ("requested number of devices unavailable ... Available: 0").
        if not kubelet.wait_for(lambda: not _unadvertised(kubelet, wanted), READY_TIMEOUT):
            raise RuntimeError(
                f"device plugin of {node} did not advertise "
                f"{', '.join(_unadvertised(kubelet, wanted))} within {READY_TIMEOUT:g}s "
                "(not registered with the kubelet, or no healthy device sent over ListAndWatch)"
            )
        admitted = [
            ContainerEnvironment(node, c.pod, c.name, c.init, c.envs)
            for pod in pods
            for c in kubelet.admit(pod)
            if c.envs
        ]
        plugin.assignments.flush(READY_TIMEOUT)
        return admitted
    finally:
        plugin.stop()
        kubelet.stop()


def _unadvertised(kubelet: KubeletStandIn, wanted: Iterable[str]) -> list[str]:
    """The resources of `wanted` the node offers no device of yet."""
    registered = kubelet.registered()
    return sorted(r for r in wanted if r not in registered or kubelet.capacity(r)[1] == 0)
