"""Processes on the node, read from a /proc tree (the host's, mounted wherever --proc-root says).

Maps a process to its pod and container through /proc/<pid>/cgroup (cgroup v2
and v1 lines; containerd, CRI-O and Docker ID forms; systemd and cgroupfs
drivers) and reads its environment from /proc/<pid>/environ, where the device
plugin's contract variables are.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpushare import environment

_CONTAINER: Final = re.compile(
    r"(?:^|/)(?P<prefix>cri-containerd-|crio-|docker-|containerd-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$"
)
_POD_UID: Final = re.compile(
    r"pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)
_RUNTIMES: Final = {
    "cri-containerd-": "containerd",
    "containerd-": "containerd",
    "crio-": "cri-o",
    "docker-": "docker",
}


@dataclass(frozen=True, slots=True)
class CgroupRef:
    """Where a container's processes live in the cgroup hierarchy."""

    container_id: str
    pod_uid: str
    runtime: str
    """containerd, cri-o, docker, or empty when the path does not say (cgroupfs driver)."""
    unified: str | None
    """Its path in the cgroup v2 (unified) hierarchy, from the `0::` line."""
    freezer: str | None
    """Its path in the cgroup v1 freezer hierarchy."""


def parse_cgroup(text: str) -> CgroupRef | None:
    """The container of a process from the text of /proc/<pid>/cgroup; None outside one."""
    unified: str | None = None
    freezer: str | None = None
    paths: list[str] = []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and not controllers:
            unified = path
        elif "freezer" in controllers.split(","):
            freezer = path
        paths.append(path)
    for path in [p for p in (unified, freezer) if p] + paths:
        found = _CONTAINER.search(path)
        if found is None:
            continue
        if "/docker/" in path or path.startswith("/docker"):
            runtime = "docker"
        else:
            runtime = _RUNTIMES.get(found.group("prefix") or "", "")
        pod = _POD_UID.search(path)
        return CgroupRef(
            container_id=found.group("id"),
            pod_uid=pod.group("uid").replace("_", "-") if pod else "",
            runtime=runtime,
            unified=unified,
            freezer=freezer,
        )
    return None


MOUNTINFO_MOST: Final = 256 * 1024
"""What is read of a process's mountinfo: its container's own mounts, the grant among
them, come first (a mount made later, in a namespace of its own, is listed after the
ones it inherited); a tenant that makes thousands of mounts does not make every
observation read megabytes."""
_GRANT_ROOT: Final = re.compile(r"/grants/(?P<id>[0-9a-f]{32})/grant$")


def parse_grant_mount(text: str) -> str:
    """The grant ID of a process from the text of /proc/<pid>/mountinfo: the mount at
    environment.GRANT_IN_CONTAINER whose source is `.../grants/<id>/grant`; '' when it
    has none. Its mounts are the node's doing (an unprivileged container cannot mount),
    unlike its environment."""
    for line in text.splitlines():
        # ID parent major:minor root mount-point options ... - type source super-options
        fields = line.split(" ", 5)
        if len(fields) < 5 or _unescape(fields[4]) != environment.GRANT_IN_CONTAINER:
            continue
        found = _GRANT_ROOT.search(_unescape(fields[3]))
        if found is not None:
            return found.group("id")
    return ""


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_environ(data: bytes) -> dict[str, str]:
    """The NUL-separated text of /proc/<pid>/environ as a mapping."""
    env: dict[str, str] = {}
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def parse_ns_pid(text: str) -> int | None:
    """A process's pid in its own, innermost pid namespace, from the text of
    /proc/<pid>/status: the last number of its `NSpid:` line (None before Linux 4.1)."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "NSpid":
            fields = value.split()
            return int(fields[-1]) if fields and fields[-1].isdigit() else None
    return None


@dataclass(frozen=True, slots=True)
class ContractProcess:
    """A process started with the contract environment (one gpushare gave limits to)."""

    pid: int
    cgroup: CgroupRef | None
    environ: dict[str, str]


class ProcessTable:
    """Reads processes from a /proc tree. Environments are cached per PID, since a
    process's initial environment does not change; `forget` drops PIDs that left."""

    def __init__(self, proc_root: Path) -> None:
        self.root = proc_root
        self._environ: dict[int, dict[str, str]] = {}
        self._grants: dict[int, str] = {}
        self._ns_pids: dict[int, int | None] = {}

    def cgroup(self, pid: int) -> CgroupRef | None:
        text = self._read(pid, "cgroup")
        return parse_cgroup(text.decode(errors="replace")) if text is not None else None

    def environ(self, pid: int) -> dict[str, str] | None:
        """Its environment, or None when the process is gone or unreadable."""
        if pid not in self._environ:
            data = self._read(pid, "environ")
            if data is None:
                return None
            self._environ[pid] = parse_environ(data)
        return self._environ[pid]

    def grant(self, pid: int) -> str:
        """The ID of the grant its container was given; '' when none (or it is gone). A
        process's mounts do not change under it: read once per PID."""
        if pid not in self._grants:
            text = self._read(pid, "mountinfo", MOUNTINFO_MOST)
            if text is None:
                return ""
            self._grants[pid] = parse_grant_mount(text.decode(errors="replace"))
        return self._grants[pid]

    def ns_pid(self, pid: int) -> int | None:
        """Its pid in its own pid namespace; None when unknown (or it is gone). Fixed for
        the process's life: read once per PID."""
        if pid not in self._ns_pids:
            text = self._read(pid, "status")
            if text is None:
                return None
            self._ns_pids[pid] = parse_ns_pid(text.decode(errors="replace"))
        return self._ns_pids[pid]

    def forget(self, keep: set[int]) -> None:
        self._environ = {pid: env for pid, env in self._environ.items() if pid in keep}
        self._grants = {pid: grant for pid, grant in self._grants.items() if pid in keep}
        self._ns_pids = {pid: ns for pid, ns in self._ns_pids.items() if pid in keep}

    def pids(self) -> list[int]:
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        return sorted(int(name) for name in names if name.isdigit())

    def pids_of(self, container_id: str) -> list[int]:
        """Every process of one container (for stopping them when its cgroup cannot freeze)."""
        found = []
        for pid in self.pids():
            ref = self.cgroup(pid)
            if ref is not None and ref.container_id == container_id:
                found.append(pid)
        return found

    def contract_processes(self) -> list[ContractProcess]:
        """Every process whose environment carries gpushare's limits."""
        found = []
        for pid in self.pids():
            env = self.environ(pid)
            if env is not None and environment.MEM_CONTAINER in env:
                found.append(ContractProcess(pid, self.cgroup(pid), env))
        self.forget({p.pid for p in found})
        return found

    def device_major(self, name: str = "nvidia-frontend", default: int = 195) -> int:
        """The character-device major of a driver, from /proc/devices."""
        try:
            text = (self.root / "devices").read_text()
        except OSError:
            return default
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == name and parts[0].isdigit():
                return int(parts[0])
        return default

    def _read(self, pid: int, name: str, most: int | None = None) -> bytes | None:
        try:
            with open(self.root / str(pid) / name, "rb") as file:
                return file.read(-1 if most is None else most)
        except OSError:
            # Gone (it exited), or not ours to read: either way there is nothing to act on.
            return None
