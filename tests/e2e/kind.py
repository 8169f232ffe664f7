"""A kind cluster driven through the real CLIs (docker, kind, kubectl, helm)."""

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e.kube import ROOT, KubectlTarget, run

TOOLS = ("docker", "kind", "kubectl", "helm")


def missing_prerequisites() -> str | None:
    """Why the suite cannot run on this machine, or None when it can."""
    if os.environ.get("GPUSHARE_E2E") == "0":
        return "GPUSHARE_E2E=0 turns the kind e2e suite off"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    reasons = [f"missing {', '.join(missing)} on PATH"] if missing else []
    if "docker" not in missing:
        probe = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:
            reasons.append("no Docker engine reachable (docker info failed)")
    if not reasons:
        return None
    return "the kind e2e suite needs docker (with an engine), kind, kubectl and helm: " + (
        "; ".join(reasons)
    )


@dataclass
class Kind(KubectlTarget):
    name: str = "gpushare-e2e"

    def create(self) -> None:
        run(["kind", "create", "cluster", "--config", str(ROOT / "kind-config.yaml"),
             "--name", self.name, "--kubeconfig", str(self.kubeconfig), "--wait", "180s"],
            timeout=600)  # fmt: skip

    def exists(self) -> bool:
        clusters = run(["kind", "get", "clusters"]).stdout.split()
        return self.name in clusters

    def export_kubeconfig(self) -> None:
        run(["kind", "export", "kubeconfig", "--name", self.name,
             "--kubeconfig", str(self.kubeconfig)])  # fmt: skip

    def delete(self) -> None:
        run(["kind", "delete", "cluster", "--name", self.name], check=False, timeout=300)

    def load_image(self, image: str) -> None:
        run(["kind", "load", "docker-image", image, "--name", self.name], timeout=600)

    def kill_containers(self, pod: dict[str, Any]) -> list[str]:
        """SIGKILL every container of the pod, through the node's CRI (no grace)."""
        node = pod["spec"]["nodeName"]
        killed = []
        for status in pod["status"]["containerStatuses"]:
            container_id = status["containerID"].split("://", 1)[1]
            run(["docker", "exec", node, "crictl", "stop", "--timeout", "0", container_id])
            killed.append(status["name"])
        return killed

    def dump(self, into: Path, namespaces: dict[str, str]) -> Path:
        """Everything needed to see why a test failed, one file per command; `namespaces`
        maps each namespace to the label selector of the pods whose logs to keep."""
        into.mkdir(parents=True, exist_ok=True)
        commands = {
            "nodes.yaml": ["get", "nodes", "-o", "yaml"],
            "pods.txt": ["get", "pods", "-A", "-o", "wide"],
            "events.txt": ["get", "events", "-A", "--sort-by=.lastTimestamp"],
        }
        for namespace, selector in namespaces.items():
            commands[f"describe-{namespace}.txt"] = ["describe", "pods", "-n", namespace]
            commands[f"logs-{namespace}.txt"] = [
                "logs", "-n", namespace, "--all-containers", "--prefix", "--tail=-1",
                "--max-log-requests=50", "-l", selector,
            ]  # fmt: skip
        for name, args in commands.items():
            result = self.kubectl(*args, check=False, timeout=120)
            (into / name).write_text(result.stdout + result.stderr)
        return into
