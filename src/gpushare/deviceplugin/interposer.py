"""Loading the CUDA interposer into a container: the mounts and variable Allocate adds.

The isolation agent puts libgpushare-cuda.so and an ld.so.preload naming it into the
node's interposer directory when it starts (it owns the library: isolation/interposer/).
For a container whose memory is capped (`environment.isolated_at_the_call`), Allocate
then mounts both read-only — the preload file over the container's /etc/ld.so.preload, so
the dynamic loader maps the library into every process of the container — and the
container's own accounting directory read-write, made here under `regions/`, whose region
file GPUSHARE_CUDA_REGION names. Until the agent has installed the library nothing is
added: the container runs without it and the agent enforces after the fact.
"""

import logging
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpushare.deviceplugin.api.kubelet.deviceplugin.v1beta1 import api_pb2 as pb
from gpushare.environment import (
    ACCOUNTING_DIR_IN_CONTAINER,
    CUDA_REGION,
    INTERPOSER_IN_CONTAINER,
    REGION_FILE,
)

log = logging.getLogger(__name__)

LIBRARY_NAME: Final = "libgpushare-cuda.so"
PRELOAD_NAME: Final = "ld.so.preload"
REGIONS: Final = "regions"
PRELOAD_IN_CONTAINER: Final = "/etc/ld.so.preload"


@dataclass(frozen=True, slots=True)
class Injection:
    mounts: tuple[pb.Mount, ...]
    env: dict[str, str]


@dataclass(frozen=True, slots=True)
class InterposerMounts:
    """The node's interposer directory, as the plugin and the kubelet both see it (the
    chart mounts the hostPath at the same path in the node containers)."""

    directory: Path

    @property
    def installed(self) -> bool:
        return (self.directory / LIBRARY_NAME).is_file() and (
            self.directory / PRELOAD_NAME
        ).is_file()

    def accounting_dir(self, pod_uid: str, container: str) -> Path:
        return self.directory / REGIONS / pod_uid / container

    def for_container(self, pod_uid: str, container: str) -> Injection | None:
        """The mounts and variable that load the interposer into one container, its
        accounting directory made; None while the agent has not installed the library."""
        if not self.installed:
            return None
        accounting = self.accounting_dir(pod_uid, container)
        accounting.mkdir(parents=True, exist_ok=True)
        # Any user of the container's image must be able to create the region in it; the
        # directory is mounted into that one container only.
        accounting.chmod(0o777)
        return Injection(
            mounts=(
                pb.Mount(
                    container_path=INTERPOSER_IN_CONTAINER,
                    host_path=str(self.directory / LIBRARY_NAME),
                    read_only=True,
                ),
                pb.Mount(
                    container_path=PRELOAD_IN_CONTAINER,
                    host_path=str(self.directory / PRELOAD_NAME),
                    read_only=True,
                ),
                pb.Mount(
                    container_path=ACCOUNTING_DIR_IN_CONTAINER,
                    host_path=str(accounting),
                    read_only=False,
                ),
            ),
            env={CUDA_REGION: f"{ACCOUNTING_DIR_IN_CONTAINER}/{REGION_FILE}"},
        )

    def prune(self, live_pod_uids: Collection[str]) -> list[str]:
        """Removes the accounting directories of pods no longer bound to this node; the
        UIDs removed."""
        root = self.directory / REGIONS
        if not root.is_dir():
            return []
        gone = [d for d in root.iterdir() if d.is_dir() and d.name not in live_pod_uids]
        for directory in gone:
            shutil.rmtree(directory, ignore_errors=True)
        if gone:
            log.info("removed the accounting directories of %d pod(s) gone", len(gone))
        return [d.name for d in gone]
