"""Prometheus's own binaries for the tests: `promtool` (the alert rules' unit tests) and
`prometheus` (the real-cluster tier scrapes our components with it). Both come from
Debian's `prometheus` package, installed here once when missing, as
../shared/realcluster/prepare.sh installs the cluster's packages: the test setup runs as
root here and in CI, with apt reachable. Where it cannot be had, the tests skip with
the reason this module gives."""

import fcntl
import os
import shutil
import subprocess
from pathlib import Path
from typing import Final

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
