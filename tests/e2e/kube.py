"""What every way of getting a cluster shares: kubectl against one kubeconfig.

The scenarios talk to a `KubectlTarget` only, so the same checks run on the local
real cluster (`tests/e2e/local.py`), on kind (`tests/e2e/kind.py`) and on any
cluster a KUBECONFIG names.
"""

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

ROOT = Path(__file__).resolve().parents[2]

T = TypeVar("T")


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
class KubectlTarget:
    """A cluster reached with kubectl and one kubeconfig file."""

    kubeconfig: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run(["kubectl", *args], env=self.env, check=check, timeout=timeout, stdin=stdin)

    def helm(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run(["helm", *args], env=self.env, timeout=timeout)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, documents: list[dict[str, Any]], check: bool = True, *extra: str):
        return self.kubectl(
            "apply", *extra, "-f", "-", stdin=yaml.safe_dump_all(documents), check=check
        )

    def create(self, documents: list[dict[str, Any]], check: bool = True):
        return self.kubectl("create", "-f", "-", stdin=yaml.safe_dump_all(documents), check=check)

    def container_log(self, pod: dict[str, Any], container: str) -> str:
        """What a container printed (its latest run)."""
        meta = pod["metadata"]
        return self.kubectl("logs", "-n", meta["namespace"], meta["name"], "-c", container).stdout

    def pods(self, selector: str, namespace: str = "default") -> list[dict[str, Any]]:
        return self.get("pods", "-n", namespace, "-l", selector)["items"]

    def wait_running(
        self, selector: str, count: int, timeout: float = 120, namespace: str = "default"
    ) -> list[dict[str, Any]]:
        """The `count` pods matching `selector` once every one of them is Running."""

        def all_running() -> list[dict[str, Any]] | None:
            pods = self.pods(selector, namespace)
            phases = [p["status"].get("phase") for p in pods]
            return pods if len(pods) == count and set(phases) == {"Running"} else None

        return wait_for(f"{count} pods {selector} Running", all_running, timeout, every=0.5)

    def delete_all(self, selector: str, kinds: str = "jobs,pods", timeout: float = 120) -> None:
        """Deletes and waits until they are gone (their slices are free only then)."""
        self.kubectl(
            "delete", kinds, "-l", selector, "--wait=true", f"--timeout={timeout:.0f}s",
            "--ignore-not-found", timeout=timeout + 30,
        )  # fmt: skip

    def running(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        """The pod, once it is Running; None before."""
        raw = self.get("pod", "-n", namespace, name)
        return raw if raw["status"].get("phase") == "Running" else None

    def events_for(self, name: str, namespace: str = "default") -> list[dict[str, Any]]:
        selector = f"involvedObject.name={name}"
        return self.get("events", "-n", namespace, "--field-selector", selector)["items"]
