"""The real single-node cluster with a pod network, and gpushare installed into it
with `helm install`, as an operator does: from the release's artifacts
(tests/e2e/artifacts.py), as docs/install.md says.

`../shared/realcluster` in bridge mode (POD_NETWORK=bridge) gives pods real
addresses, in-cluster API access with ServiceAccount tokens, and calls webhooks at
their Service's endpoints, so the chart's own pods run: the DaemonSet (device plugin
with the mock backend, isolation agent), the two-replica scheduler Deployment
(kube-scheduler + our extender and webhook) and the chart's uninstall hook. The
images come from no registry: ours from the release's OCI archive (the Dockerfile's
image, built offline by scripts/release), imported into the node's containerd under the
chart's default name; kube-scheduler from the harness's `mkimage-binary.sh` holding
the version's own binary.
"""

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tests.e2e.artifacts import Artifacts
from tests.e2e.chart_scenarios import Installed
from tests.e2e.helm import HelmRelease
from tests.e2e.kube import run, wait_for
from tests.e2e.local import GPU_SIZES, MOCK_GPUS, NODE, LocalCluster
from tests.e2e.workloads import BUSYBOX

RELEASE: Final = "gpushare"
NAMESPACE: Final = "gpushare-system"
SCHEDULER_IMAGE: Final = "local/kube-scheduler"
MODE: Final = "core_mem"
GPU_COUNT: Final = len(GPU_SIZES)


def chart_values(version: str, **extra: Any) -> dict[str, Any]:
    """What an operator without GPUs sets: the mock backend, and the scheduler image
    built here. gpushare's image is the chart's default, loaded from the release."""
    values: dict[str, Any] = {
        "gpu": {"backend": "mock", "mockGpus": MOCK_GPUS},
        "scheduler": {
            "image": {"repository": SCHEDULER_IMAGE, "tag": version, "pullPolicy": "IfNotPresent"}
        },
    }
    for key, value in extra.items():
        values.setdefault(key, {}).update(value)
    return values


@dataclass
class ChartCluster(LocalCluster):
    """LocalCluster in bridge mode whose gpushare is the chart's pods."""

    artifacts: Artifacts | None = None
    release: HelmRelease | None = None
    installed_at: float = 0.0
    """time.monotonic() when `helm install` started."""
    values: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pod_network = "bridge"

    @property
    def containerd_socket(self) -> Path:
        return self.state / "containerd" / "containerd.sock"

    def start_cluster(self) -> None:
        self.script("prepare.sh")
        self.script("up.sh", NO_FAKE_DP="1", EXTENDER_URL="", WITH_KCM="1")

    def install_gpushare(self) -> None:
        assert self.artifacts is not None and self.bins is not None
        # docs/install.md: `ctr -n k8s.io images import` on the node, here against the
        # cluster's own containerd.
        run(
            ["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io",
             "images", "import", str(self.artifacts.image_archive)],
            timeout=300,
        )  # fmt: skip
        self.script(
            "mkimage-binary.sh",
            f"{SCHEDULER_IMAGE}:{self.version}",
            str(self.bins.directory / "kube-scheduler"),
        )
        self.release = HelmRelease(self.kubeconfig, RELEASE, NAMESPACE, chart=self.artifacts.chart)
        self.values = chart_values(self.version)
        # The operator's order (docs/install.md): install, then label the GPU nodes.
        self.installed_at = time.monotonic()
        self.release.install(self.values)
        self.timings["helm install (--wait)"] = time.monotonic() - self.installed_at
        labelled = time.monotonic()
        self.kubectl("label", "node", NODE, f"ack.node.gpu.schedule={MODE}", "--overwrite")
        self.wait_advertised()
        self.timings["label to GPUs advertised"] = time.monotonic() - labelled
        self.timings["install to GPUs advertised"] = time.monotonic() - self.installed_at

    def wait_advertised(self, timeout: float = 120) -> None:
        wait_for(
            "the node to advertise the mock GPUs",
            lambda: (
                self.allocatable("aliyun.com/gpu-mem") == sum(GPU_SIZES)
                and self.allocatable("aliyun.com/gpu-count") == GPU_COUNT
            ),
            timeout=timeout,
            every=0.5,
        )

    # ----- the chart's pods

    def installed(self) -> Installed:
        assert self.release is not None
        return Installed(
            target=self,
            release=self.release,
            values=self.values,
            nodes=[NODE],
            image=BUSYBOX,
            pull_policy="IfNotPresent",
            kill_containers=self.kill_containers,
            installed_at=self.installed_at,
            own_image=self.artifacts.image_reference if self.artifacts else "",
        )

    def kill_containers(self, pod: dict[str, Any]) -> list[str]:
        """SIGKILL every container of the pod, as a crashed process would die: nothing is
        released, the kubelet restarts them. Returns the container names."""
        killed = []
        for status in pod["status"]["containerStatuses"]:
            container_id = status["containerID"].split("://", 1)[1]
            run(
                ["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io",
                 "tasks", "kill", "--signal", "SIGKILL", container_id],
                timeout=30,
            )  # fmt: skip
            killed.append(status["name"])
        return killed

    def dump(self, into: Path) -> Path:
        """Besides LocalCluster's: every container's log, from the kubelet's directory."""
        super().dump(into)
        pods = self.state / "ns" / "var-log" / "pods"
        if pods.is_dir():
            shutil.copytree(pods, into / "pod-logs", dirs_exist_ok=True)
        return into
