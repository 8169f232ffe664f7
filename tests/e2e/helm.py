"""A Helm release of our chart, driven by Helm itself: the `helm` CLI where it is
installed, otherwise Helm's Go SDK through helm-python-sdk (the same install, upgrade
and uninstall actions, hooks, `lookup` and release history, without the binary)."""

import io
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.kube import ROOT, run

CHART = ROOT / "helm" / "gpushare"


def previous_chart(into: Path) -> Path | None:
    """helm/gpushare as the previous commit had it, or None without that history."""
    probe = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", "HEAD~1"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return None
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD~1", "helm/gpushare"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "helm" / "gpushare"


@dataclass
class HelmRelease:
    kubeconfig: Path
    name: str
    namespace: str
    chart: Path = CHART
    """What install and upgrade apply unless told otherwise: the chart's directory, or a
    packaged .tgz (the chart tier installs the release's)."""
    timeout_s: int = 300

    @property
    def uses_cli(self) -> bool:
        return shutil.which("helm") is not None

    def install(self, values: dict[str, Any], chart: Path | None = None) -> None:
        self._apply("install", chart or self.chart, values)

    def upgrade(self, values: dict[str, Any], chart: Path | None = None) -> None:
        self._apply("upgrade", chart or self.chart, values)

    def exists(self) -> bool:
        if self.uses_cli:
            listed = self._cli("list", "-q", "--filter", f"^{self.name}$").stdout
            return self.name in listed.split()
        with self._sdk() as config:
            return any(r["name"] == self.name for r in config.list())

    def install_or_upgrade(self, values: dict[str, Any]) -> None:
        (self.upgrade if self.exists() else self.install)(values)

    def uninstall(self) -> None:
        if self.uses_cli:
            self._cli("uninstall", self.name, "--wait", "--timeout", f"{self.timeout_s}s")
            return
        with self._sdk() as config:
            config.uninstall(self.name, timeout=self.timeout_s, wait="watcher")

    def manifest(self) -> list[dict[str, Any]]:
        """The objects of the release's current revision, as Helm recorded them."""
        if self.uses_cli:
            text = self._cli("get", "manifest", self.name).stdout
        else:
            with self._sdk() as config:
                text = config.status(self.name)["manifest"]
        return [d for d in yaml.safe_load_all(text) if d]

    def revision(self) -> int:
        if self.uses_cli:
            status = yaml.safe_load(self._cli("status", self.name, "-o", "yaml").stdout)
            return int(status["version"])
        with self._sdk() as config:
            return int(config.status(self.name)["revision"])

    def _apply(self, action: str, chart: Path, values: dict[str, Any]) -> None:
        if self.uses_cli:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
                yaml.safe_dump(values, file)
                file.flush()
                self._cli(
                    action, self.name, str(chart), "--create-namespace", "-f", file.name,
                    "--wait", "--timeout", f"{self.timeout_s}s",
                    *(["--reset-values"] if action == "upgrade" else []),
                )  # fmt: skip
            return
        with self._sdk() as config:
            if action == "install":
                config.install(
                    str(chart), self.name, values, namespace=self.namespace,
                    create_namespace=True, timeout=self.timeout_s, wait="watcher",
                )  # fmt: skip
            else:
                config.upgrade(
                    str(chart), self.name, values, namespace=self.namespace,
                    timeout=self.timeout_s, wait="watcher", reset_values=True,
                )  # fmt: skip

    def _cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run(
            ["helm", *args, "--kubeconfig", str(self.kubeconfig), "-n", self.namespace],
            timeout=self.timeout_s + 60,
        )

    def _sdk(self):  # type: ignore[no-untyped-def]
        import helm_python

        return helm_python.Config(kubeconfig_path=self.kubeconfig, namespace=self.namespace)
