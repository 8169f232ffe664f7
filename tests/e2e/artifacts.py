"""The release artifacts the chart tier installs from: scripts/release (with the image)
run once per session into a temporary directory, as an operator receives them."""

import os
import shutil
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.kube import ROOT, run

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@dataclass(frozen=True)
class Artifacts:
    """Names as docs/install.md gives them (the shared artifact names)."""

    directory: Path
    version: str = VERSION
    took_s: float = 0.0

    @property
    def chart(self) -> Path:
        return self.directory / f"gpushare-{self.version}.tgz"

    @property
    def image_archive(self) -> Path:
        return self.directory / f"gpushare-image-{self.version}.oci.tar"

    @property
    def image_digest(self) -> str:
        return (self.directory / f"gpushare-image-{self.version}.digest").read_text().strip()

    @property
    def image_reference(self) -> str:
        """The chart's default image (values.yaml's repository, tag = appVersion)."""
        return f"docker.io/gpushare/gpushare:{self.version}"


def missing_prerequisites() -> str | None:
    """Why the release with its image cannot be made here, or None."""
    if os.geteuid() != 0:
        return "the release's image needs root (mmdebstrap and chroot)"
    if shutil.which("mmdebstrap") is None and shutil.which("apt-get") is None:
        return "the release's image needs mmdebstrap (or apt-get to install it)"
    return None


def make(into: Path) -> Artifacts:
    """`scripts/release --out INTO` with this venv's Python (what scripts/release runs
    after its bootstrap)."""
    started = time.monotonic()
    run([sys.executable, str(ROOT / "scripts" / "release.py"), "--out", str(into)], timeout=900)
    return Artifacts(into, took_s=time.monotonic() - started)
