"""The NVML backend: real GPUs through an injected nvidia-ml-py (pynvml), containers
through /proc and cgroups.

The GPUs come from gpushare.nvmllib's discovery, shared with the device plugin.
NVML names the processes on each GPU, their memory and (sampled by the driver) their
share of the GPU's streaming multiprocessors. /proc says which container each belongs
to and what limits it was started with; the cgroup tree freezes it. NVML reports host
PIDs, so the agent runs with the host's PID namespace and reads the host's /proc at
--proc-root.
"""

import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpushare import environment
from gpushare.inventory import MemoryRounding
from gpushare.isolation.backends.cgroupfs import FreezeMethod, Freezer
from gpushare.isolation.backends.port import GpuDevice, GpuProcess, Observation
from gpushare.isolation.backends.procfs import CgroupRef, ProcessTable
from gpushare.isolation.clock import Clock
from gpushare.nvmllib.discovery import GpuDiscovery, Nvml

log = logging.getLogger("gpushare.isolation.nvml")


class ProcessInfo(Protocol):
    """pynvml's c_nvmlProcessInfo_t: usedGpuMemory is None where NVML cannot say."""

    @property
    def pid(self) -> int: ...

    @property
    def usedGpuMemory(self) -> int | None: ...


class UtilisationSample(Protocol):
    """pynvml's c_nvmlProcessUtilizationSample_t (timeStamp in microseconds)."""

    @property
    def pid(self) -> int: ...

    @property
    def smUtil(self) -> int: ...

    @property
    def timeStamp(self) -> int: ...


class ProcessNvml(Nvml, Protocol):
    """The pynvml calls the agent makes, besides discovery's."""

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> Sequence[ProcessInfo]: ...

    def nvmlDeviceGetProcessUtilization(
        self, handle: object, since_us: int
    ) -> Sequence[UtilisationSample]: ...


@dataclass(slots=True)
class _Member:
    """A container the backend may have to thaw: its cgroup and GPU processes."""

    ref: CgroupRef | None
    pids: list[int] = field(default_factory=list)


class NvmlBackend:
    """Implements `IsolationBackend` on the node's NVIDIA GPUs. nvml: pynvml
    (gpushare.nvmllib.bindings()); NVML starts here and shuts down at close. Raises
    NvmlUnavailable saying what to do when NVML cannot list the GPUs."""

    name = "nvml"

    def __init__(
        self,
        nvml: ProcessNvml,
        proc_root: Path,
        cgroup_root: Path,
        clock: Clock,
        send_signal: Callable[[int, int], None] = os.kill,
        memory_rounding: MemoryRounding = MemoryRounding.UP,
    ) -> None:
        self._nvml = nvml
        self._gpus = GpuDiscovery(nvml)
        found = self._gpus.discover()
        self._clock = clock
        self._send_signal = send_signal
        self.processes = ProcessTable(proc_root)
        self.freezer = Freezer(cgroup_root, self.processes, send_signal)
        self.methods: dict[str, FreezeMethod] = {}
        """How each container was last frozen or thawed (for logs and tests)."""
        self._handles = [gpu.handle for gpu in found]
        major = self.processes.device_major()
        self._devices = tuple(
            GpuDevice(
                index=gpu.index,
                uuid=gpu.uuid,
                mem_bytes=gpu.mem_bytes,
                model=gpu.model,
                major=major,
                rounding=memory_rounding,
            )
            for gpu in found
        )
        self._seen_us = [0] * len(found)
        self._members: dict[str, _Member] = {}
        self._frozen: dict[str, bool] = {}
        self._warned_blind = False

    def devices(self) -> tuple[GpuDevice, ...]:
        return self._devices

    def observe(self) -> Observation:
        found: list[GpuProcess] = []
        members: dict[str, _Member] = {}
        unseen = 0
        for device, handle in zip(self._devices, self._handles, strict=True):
            utilisation = self._utilisation(device.index, handle)
            for info in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                process = self._process(device.index, info, utilisation)
                if process is None:
                    unseen += 1
                    continue
                found.append(process)
                if environment.MEM_CONTAINER not in process.environ and not process.grant_id:
                    continue  # not started by gpushare: never frozen, so never thawed either
                member = members.setdefault(
                    process.container_key, _Member(self.processes.cgroup(process.pid))
                )
                member.pids.append(process.pid)
        self._check_pid_namespace(unseen, len(found))
        self.processes.forget({p.pid for p in found})
        # A frozen container whose GPU processes all went stays known until it is thawed.
        for key, member in self._members.items():
            if key not in members and self._frozen.get(key):
                members[key] = member
        self._members = members
        self.freezer.forget({m.ref.container_id for m in members.values() if m.ref is not None})
        return Observation(self._clock.now(), tuple(found))

    def _check_pid_namespace(self, unseen: int, seen: int) -> None:
        """NVML names host PIDs: if none of them is in --proc-root, nothing can be enforced."""
        blind = unseen > 0 and seen == 0
        if blind and not self._warned_blind:
            log.warning(
                "NVML reports %d GPU processes, none of them readable under %s: run the agent "
                "in the host's PID namespace (hostPID) as root, with the host's /proc there",
                unseen,
                self.processes.root,
            )
        self._warned_blind = blind

    def hold(self, frozen: frozenset[str]) -> None:
        for key, member in self._members.items():
            want = key in frozen
            if self._frozen.get(key) is not want:
                self.methods[key] = self.freezer.set_frozen(member.ref, member.pids, want)
                self._frozen[key] = want
        self._frozen = {key: state for key, state in self._frozen.items() if key in self._members}

    def kill(self, pid: int) -> None:
        try:
            self._send_signal(pid, signal.SIGKILL)
        except ProcessLookupError:
            return

    def close(self) -> None:
        self.hold(frozenset())
        self._gpus.close()

    def _process(
        self, index: int, info: ProcessInfo, utilisation: dict[int, float] | None
    ) -> GpuProcess | None:
        pid = int(info.pid)
        environ = self.processes.environ(pid)
        if environ is None:
            return None
        ref = self.processes.cgroup(pid)
        return GpuProcess(
            pid=pid,
            gpu_index=index,
            mem_bytes=int(info.usedGpuMemory or 0),
            sm_percent=None if utilisation is None else utilisation.get(pid, 0.0),
            container_id=ref.container_id if ref else "",
            pod_uid=ref.pod_uid if ref else "",
            environ=environ,
            ns_pid=self.processes.ns_pid(pid),
            grant_id=self.processes.grant(pid),
        )

    def _utilisation(self, index: int, handle: object) -> dict[int, float] | None:
        """Mean SM utilisation per PID over the driver's samples since the last call;
        None when the driver has none (no new sample yet, or not supported)."""
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, self._seen_us[index])
        except self._nvml.NVMLError:
            return None
        if not samples:
            return None
        totals: dict[int, list[float]] = {}
        for sample in samples:
            totals.setdefault(int(sample.pid), []).append(float(sample.smUtil))
            self._seen_us[index] = max(self._seen_us[index], int(sample.timeStamp))
        return {pid: sum(values) / len(values) for pid, values in totals.items()}
