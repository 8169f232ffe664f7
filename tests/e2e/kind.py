"""A kind cluster driven through the real CLIs (docker, kind, kubectl, helm)."""

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("docker", "kind", "kubectl", "helm")

T = TypeVar("T")


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


def run(
    args: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    check: bool = True,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, env=env, input=stdin
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )
    return result


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 300, every: float = 3) -> T:
    """Poll until probe() returns something truthy; fail naming `what` after the timeout."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except (AssertionError, subprocess.SubprocessError, ValueError, KeyError) as err:
            last = err
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last error: {last}")


@dataclass
class Kind:
    name: str
    kubeconfig: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

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

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run(["kubectl", *args], env=self.env, check=check, timeout=timeout, stdin=stdin)

    def helm(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run(["helm", *args], env=self.env, timeout=timeout)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, documents: list[dict[str, Any]], check: bool = True):
        return self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(documents), check=check)

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
