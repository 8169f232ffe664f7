"""Loading the CUDA interposer into a container: the mounts and variable Allocate (and
the DRA driver's Prepare) adds.

The isolation agent puts libgpushare-cuda.so and an ld.so.preload naming it into the
node's interposer directory when it starts (it owns the library: isolation/interposer/).
For a container whose memory is capped (`environment.isolated_at_the_call`), Allocate
then writes a grant (gpushare.grant: the caps, GPUs and shares the node decided) under
`grants/<id>/`, one per answer, and mounts: the library and the preload file read-only
(the preload file over the container's /etc/ld.so.preload, so the dynamic loader maps
the library into every process of the container), the grant read-only at
/etc/gpushare/grant, and the grant's own accounting directory read-write at
/run/gpushare, where the library makes the region. The container can write its region
but not its grant: the library and the agent take what they enforce from the grant.
Until the agent has installed the library nothing is added: the container runs without
it and the agent enforces after the fact.
"""

import dataclasses
import logging
import shutil
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from gpushare import grant as grants
from gpushare.environment import (
    ACCOUNTING_DIR_IN_CONTAINER,
    CUDA_REGION,
    GRANT_IN_CONTAINER,
    INTERPOSER_IN_CONTAINER,
    REGION_FILE,
    ContainerLimits,
)
from gpushare.objects import Pod

log = logging.getLogger(__name__)

LIBRARY_NAME: Final = "libgpushare-cuda.so"
PRELOAD_NAME: Final = "ld.so.preload"
REGIONS: Final = "regions"
"""Where plugins before grants made each container's accounting directory (by pod UID and
container name); only pruned now."""
PRELOAD_IN_CONTAINER: Final = "/etc/ld.so.preload"


@dataclass(frozen=True, slots=True)
class Mount:
    """A bind mount into the container: a Mount of the Allocate answer, or a mount of
    a CDI spec's container edits."""

    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class Injection:
    mounts: tuple[Mount, ...]
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

    def grant_dir(self, grant_id: str) -> Path:
        return self.directory / grants.GRANTS / grant_id

    def for_container(self, pod_uid: str, limits: ContainerLimits) -> Injection | None:
        """The mounts and variable that load the interposer into one container, its
        grant written and accounting directory made; None while the agent has not
        installed the library."""
        if not self.installed:
            return None
        region = f"{ACCOUNTING_DIR_IN_CONTAINER}/{REGION_FILE}"
        grant = grants.grant_for(uuid.uuid4().hex, pod_uid, limits, region)
        folder = self.grant_dir(grant.id)
        accounting = folder / grants.REGION_DIR
        accounting.mkdir(parents=True)
        # Any user of the container's image must be able to create the region in it; the
        # directory is mounted into that one container only.
        accounting.chmod(0o777)
        _write_atomically(folder / grants.GRANT_FILE, grants.encode(grant))
        return Injection(
            mounts=(
                Mount(
                    container_path=INTERPOSER_IN_CONTAINER,
                    host_path=str(self.directory / LIBRARY_NAME),
                    read_only=True,
                ),
                Mount(
                    container_path=PRELOAD_IN_CONTAINER,
                    host_path=str(self.directory / PRELOAD_NAME),
                    read_only=True,
                ),
                Mount(
                    container_path=GRANT_IN_CONTAINER,
                    host_path=str(folder / grants.GRANT_FILE),
                    read_only=True,
                ),
                Mount(
                    container_path=ACCOUNTING_DIR_IN_CONTAINER,
                    host_path=str(accounting),
                    read_only=False,
                ),
            ),
            # Older libraries find the region by this variable; this one by the grant.
            env={CUDA_REGION: region},
        )

    def prune(self, live_pod_uids: Collection[str]) -> list[str]:
        """Removes the grants (and accounting directories) of pods no longer bound to
        this node; the UIDs removed."""
        gone: dict[str, list[Path]] = {}
        legacy = self.directory / REGIONS
        if legacy.is_dir():
            for directory in legacy.iterdir():
                if directory.is_dir() and directory.name not in live_pod_uids:
                    gone.setdefault(directory.name, []).append(directory)
        root = self.directory / grants.GRANTS
        if root.is_dir():
            for folder in root.iterdir():
                uid = _pod_uid_of(folder)
                if uid is not None and uid not in live_pod_uids:
                    gone.setdefault(uid, []).append(folder)
        for directory in (d for folders in gone.values() for d in folders):
            shutil.rmtree(directory, ignore_errors=True)
        if gone:
            log.info("removed the grants and accounting directories of %d pod(s) gone", len(gone))
        return sorted(gone)

    def relabel(self, grant_id: str, pod: Pod, container: str) -> bool:
        """Names the pod and container that really run under the grant, where the kubelet
        admitted another container than the plugin matched (a repair): the caps and GPUs
        stay those the container was started with; what the agent shows it as changes.
        False when there is no such grant to correct."""
        path = self.grant_dir(grant_id) / grants.GRANT_FILE
        try:
            grant = grants.decode(path.read_bytes())
        except (OSError, grants.GrantError) as err:
            log.warning("grant %s cannot be corrected to %s: %s", grant_id, pod.key, err)
            return False
        corrected = dataclasses.replace(
            grant,
            pod_uid=pod.metadata.uid,
            namespace=pod.metadata.namespace,
            pod=pod.metadata.name,
            container=container,
        )
        if corrected != grant:
            _write_atomically(path, grants.encode(corrected))
            log.info("grant %s now names %s container %s", grant_id, pod.key, container)
        return True


class Mounted(Protocol):
    """A mount as an answer carries it (ours, or the device plugin API's `Mount`)."""

    @property
    def container_path(self) -> str: ...

    @property
    def host_path(self) -> str: ...


def grant_mounted(mounts: Iterable[Mounted]) -> str:
    """The ID of the grant an answer mounts; '' when it mounts none."""
    for mount in mounts:
        if mount.container_path == GRANT_IN_CONTAINER:
            return Path(mount.host_path).parent.name
    return ""


def _pod_uid_of(folder: Path) -> str | None:
    """The pod a grant folder is for; None while it is being written (no grant file yet:
    Allocate makes the folder first) or when it is no folder of ours. A grant that cannot
    be read any more is the plugin's own damage: its pod is taken as gone ("")."""
    try:
        data = (folder / grants.GRANT_FILE).read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    try:
        return grants.decode(data).pod_uid
    except grants.GrantError:
        return ""


def _write_atomically(path: Path, data: bytes) -> None:
    """Readers see the whole grant or none: written beside, then renamed over. Not synced
    to disk (it is written in Allocate): after a crash of the node the kubelet allocates
    again, and that answer writes a grant of its own."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    partial.chmod(0o644)
    partial.replace(path)
