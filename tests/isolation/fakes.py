"""Fake /proc and cgroup trees in tmp dirs, and a stand-in for the pynvml module, so the
NVML backend's /proc, cgroup and signal handling runs without a GPU."""

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

POD_UID = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
CONTAINERD_ID = "a" * 64
CRIO_ID = "b" * 64


def systemd_path(container_id: str, prefix: str = "cri-containerd-") -> str:
    uid = POD_UID.replace("-", "_")
    return (
        "/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{uid}.slice/{prefix}{container_id}.scope"
    )


def add_process(
    proc: Path, pid: int, cgroup: str, environ: Mapping[str, str] | None = None
) -> None:
    directory = proc / str(pid)
    directory.mkdir(parents=True)
    (directory / "cgroup").write_text(cgroup)
    data = b"".join(f"{k}={v}".encode() + b"\0" for k, v in (environ or {}).items())
    (directory / "environ").write_bytes(data)


def add_cgroup(root: Path, path: str, pids: list[int], freeze: bool = True) -> Path:
    directory = root / path.lstrip("/")
    directory.mkdir(parents=True)
    if freeze:
        (directory / "cgroup.freeze").write_text("0\n")
    (directory / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))
    return directory


@dataclass
class Signals:
    sent: list[tuple[int, str]] = field(default_factory=list)

    def __call__(self, pid: int, signum: int) -> None:
        self.sent.append((pid, signal.Signals(signum).name))


class FakeNvmlError(Exception):
    pass


@dataclass
class FakeNvml:
    """Just the pynvml calls the backend makes, over GPUs described in plain data."""

    gpus: list[dict]
    utilisation: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    """GPU index -> samples (pid, timestamp in microseconds, smUtil)."""
    shut_down: bool = False
    NVMLError: type[Exception] = FakeNvmlError

    def nvmlInit(self) -> None:
        self.shut_down = False

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return self.gpus[handle]["uuid"].encode()

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.gpus[handle]["name"]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=self.gpus[handle]["mem"], used=0, free=0)

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=mem)
            for pid, mem in self.gpus[handle]["processes"].items()
        ]

    def nvmlDeviceGetProcessUtilization(self, handle: int, since: int) -> list[SimpleNamespace]:
        samples = [
            SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
            for pid, ts, sm in self.utilisation.get(handle, [])
            if ts > since
        ]
        if not samples:
            raise FakeNvmlError("Not Found")
        return samples
