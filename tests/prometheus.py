"""Prometheus's own binaries for the tests: `promtool` (the alert rules' unit tests) and
`prometheus` (the real-cluster tier scrapes our components with it). Both come from
Debian's `prometheus` package, installed here once when missing, as
../shared/realcluster/prepare.sh installs the cluster's packages: the test setup runs as
root here and in CI, with apt reachable. Where it cannot be had, the tests skip with
the reason this module gives."""

import fcntl
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

PACKAGE: Final = "prometheus"
ALERTS: Final = Path(__file__).resolve().parents[1] / "helm" / "gpushare" / "files" / "alerts.yaml"
"""The alert rules: the plain rules file, and the chart's PrometheusRule's groups."""
_APT_LOCK: Final = Path("/tmp/gpushare-apt.lock")
"""Two test sessions on one machine install once: the second finds the package."""


class PrometheusUnavailable(RuntimeError):
    """Why the binaries cannot be had here: the tests that need them skip with it."""


def binary(name: str) -> Path:
    """The path of `promtool` or `prometheus`, installing the package first if needed."""
    found = shutil.which(name)
    if found is None:
        _install()
        found = shutil.which(name)
    if found is None:
        raise PrometheusUnavailable(f"Debian's {PACKAGE} package brought no {name}")
    return Path(found)


def _install() -> None:
    if os.geteuid() != 0:
        raise PrometheusUnavailable(
            f"no promtool/prometheus on PATH, and installing Debian's {PACKAGE} package needs root"
        )
    if shutil.which("apt-get") is None:
        raise PrometheusUnavailable(f"no promtool/prometheus on PATH and no apt-get for {PACKAGE}")
    with _APT_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shutil.which("promtool") is not None:
            return
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
             "-o", "DPkg::Lock::Timeout=300", PACKAGE],
        ):  # fmt: skip
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
            if result.returncode != 0:
                tail = "\n".join((result.stdout + result.stderr).splitlines()[-10:])
                raise PrometheusUnavailable(f"{' '.join(command)} failed:\n{tail}")


def rules_with_for(source: Path, into: Path, hold: str) -> Path:
    """`source`'s rules with every alert's `for` set to `hold` (e.g. "2s"), written to
    `into`: the same expressions, firing within seconds for a test that cannot wait
    minutes."""
    groups = yaml.safe_load(source.read_text())
    for group in groups["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = hold
    into.write_text(yaml.safe_dump(groups, sort_keys=False))
    return into


@dataclass(frozen=True)
class Target:
    job: str
    address: str
    """host:port serving /metrics"""
    honor_labels: bool = False
    """As the chart's node ServiceMonitor: the series' own pod/container labels win."""


@dataclass
class PrometheusServer:
    """A real Prometheus on a free loopback port with its own storage in `directory`,
    scraping `targets` and evaluating `rules` every `interval`."""

    directory: Path
    targets: list[Target]
    rules: Path
    interval: str = "1s"
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    """Unix time it was started: the earliest any query can find data."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.directory / "prometheus.log"

    def start(self, timeout: float = 60) -> "PrometheusServer":
        self.directory.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval,
                       "scrape_timeout": self.interval},
            "rule_files": [str(self.rules)],
            "scrape_configs": [
                {"job_name": t.job, "honor_labels": t.honor_labels,
                 "static_configs": [{"targets": [t.address]}]}
                for t in self.targets
            ],
        }  # fmt: skip
        (self.directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = _free_port()
        self.started_at = time.time()
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(binary("prometheus")),
                 f"--config.file={self.directory / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.directory / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
                # Not a skip: a rules file Prometheus refuses stops it here.
                raise RuntimeError(f"prometheus did not get ready:\n{tail}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2):
                return True
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        """The `data` of a GET /api/v1/<path>; AssertionError naming the error if any."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now."""
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api(
            "query_range", query=expr, start=str(start), end=str(end), step=str(step)
        )["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts, as Prometheus's own rule evaluation has them."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def target_health(self) -> dict[str, str]:
        """job -> up, down or unknown."""
        active = self.api("targets", state="active")["activeTargets"]
        return {t["labels"]["job"]: t["health"] for t in active}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
