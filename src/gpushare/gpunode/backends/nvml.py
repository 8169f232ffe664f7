"""The NVML GPU backend: real GPUs through an injected nvidia-ml-py (pynvml).

Discovery is gpushare.nvmllib's, shared with the isolation agent; memory becomes
whole GiB by --gpu-memory-rounding (see gpushare.inventory.gpu_mem_gib). Health
follows the driver's event set: a critical XID or a double-bit ECC error marks the
GPU unhealthy (application XIDs are ignored, see health.py), and a GPU that stays
quiet and passes a probe (reachable, memory readable, no retired pages or remapped
rows waiting for a reset) is marked healthy again.
"""

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Protocol

from gpushare.gpunode.backends.health import DEFAULT_QUIET_PERIOD, XidHealth, is_critical_xid
from gpushare.gpunode.backends.port import DeviceNode, HealthListener, PhysicalGpu
from gpushare.inventory import Gpu, MemoryRounding, gpu_mem_gib
from gpushare.nvmllib.discovery import GpuDiscovery, Nvml, text

log = logging.getLogger(__name__)

CONTROL_DEVICES: Final = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
"""Device files every CUDA container needs besides its GPUs' /dev/nvidiaN."""

_WAIT_MS: Final = 1000


class NvmlEvent(Protocol):
    """pynvml's c_nvmlEventData_t, as nvmlEventSetWait_v2 returns it."""

    @property
    def device(self) -> object: ...

    @property
    def eventType(self) -> int: ...

    @property
    def eventData(self) -> int: ...


class HealthNvml(Nvml, Protocol):
    """The pynvml calls the health watch makes, besides discovery's."""

    NVMLError_Timeout: type[Exception]
    NVMLError_NotSupported: type[Exception]
    nvmlEventTypeXidCriticalError: int
    nvmlEventTypeDoubleBitEccError: int

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> object: ...

    def nvmlEventSetCreate(self) -> object: ...

    def nvmlEventSetFree(self, events: object) -> None: ...

    def nvmlEventSetWait_v2(self, events: object, timeout_ms: int) -> NvmlEvent: ...

    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int: ...

    def nvmlDeviceRegisterEvents(self, handle: object, types: int, events: object) -> None: ...

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: object) -> int: ...

    def nvmlDeviceGetRemappedRows(self, handle: object) -> tuple[int, int, int, int]: ...


class NvmlBackend:
    """nvml: pynvml (gpushare.nvmllib.bindings()); NVML starts at the first discovery.
    dev_root: where this process sees the node's /dev, to tell which control device
    files the node has (the plugin's --dev-root)."""

    name = "nvml"

    def __init__(
        self,
        nvml: HealthNvml,
        dev_root: Path = Path("/dev"),
        quiet_period: float = DEFAULT_QUIET_PERIOD,
        memory_rounding: MemoryRounding = MemoryRounding.UP,
    ) -> None:
        self._nvml = nvml
        self._gpus = GpuDiscovery(nvml)
        self._dev_root = dev_root
        self._quiet_period = quiet_period
        self.memory_rounding = memory_rounding

    def discover(self) -> tuple[PhysicalGpu, ...]:
        return tuple(
            PhysicalGpu(
                Gpu(
                    index=gpu.index,
                    uuid=gpu.uuid,
                    mem=gpu_mem_gib(gpu.mem_bytes, self.memory_rounding),
                    model=gpu.model,
                ),
                gpu.minor,
            )
            for gpu in self._gpus.discover()
        )

    @property
    def dev_root(self) -> Path:
        return self._dev_root

    def control_devices(self) -> list[str]:
        """The names in CONTROL_DEVICES that exist under the dev root, now: nvidia-uvm
        appears only once the driver's UVM module is loaded, often by the first CUDA
        program, so each answer looks again."""
        return [n for n in CONTROL_DEVICES if (self._dev_root / n).exists()]

    def device_nodes(self, gpus: Sequence[PhysicalGpu]) -> list[DeviceNode]:
        """Host paths are /dev/<name> whatever the dev root: the kubelet resolves them
        on the node, where the plugin's dev root (in the chart, the node's /dev mounted
        at /host/dev) is /dev."""
        names = self.control_devices() + [f"nvidia{g.minor}" for g in gpus]
        return [DeviceNode(f"/dev/{n}", f"/dev/{n}") for n in names]

    def watch_health(self, listener: HealthListener, stop: threading.Event) -> None:
        gpus = {g.gpu.uuid: g.gpu.index for g in self.discover()}
        health = XidHealth(self._quiet_period)
        events = self._nvml.nvmlEventSetCreate()
        try:
            for uuid in gpus:
                self._register(events, uuid)
            while not stop.is_set():
                now = time.monotonic()
                for index in health.due_for_probe(now):
                    uuid = next(u for u, i in gpus.items() if i == index)
                    change = health.on_probe(index, self._probe(uuid), now)
                    if change is not None:
                        listener(change)
                event = self._wait(events)
                if event is None:
                    continue
                uuid = text(self._nvml.nvmlDeviceGetUUID(event.device))
                if uuid not in gpus:
                    continue
                xid = int(event.eventData)
                if event.eventType & self._nvml.nvmlEventTypeDoubleBitEccError:
                    change = health.on_critical(gpus[uuid], "double-bit ECC error", now)
                elif is_critical_xid(xid):
                    change = health.on_xid(gpus[uuid], xid, now)
                else:
                    log.info("GPU %s: application XID %s ignored", uuid, xid)
                    continue
                if change is not None:
                    listener(change)
        finally:
            self._nvml.nvmlEventSetFree(events)

    def _register(self, events: object, uuid: str) -> None:
        nvml = self._nvml
        watched = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        try:
            supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
            nvml.nvmlDeviceRegisterEvents(handle, watched & supported, events)
        except nvml.NVMLError as err:
            log.warning("GPU %s reports no health events (%s); it stays Healthy", uuid, err)

    def _wait(self, events: object) -> NvmlEvent | None:
        try:
            return self._nvml.nvmlEventSetWait_v2(events, _WAIT_MS)
        except self._nvml.NVMLError_Timeout:
            return None
        except self._nvml.NVMLError as err:
            log.warning("waiting for NVML events failed: %s", err)
            time.sleep(_WAIT_MS / 1000)
            return None

    def _probe(self, uuid: str) -> bool:
        """True when the GPU answers and has no memory repair waiting for a reset."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError as err:
            log.info("GPU %s still unhealthy: %s", uuid, err)
            return False
        for check in (_pages_pending, _rows_pending):
            try:
                if check(nvml, handle):
                    return False
            except nvml.NVMLError_NotSupported:
                continue
            except nvml.NVMLError as err:
                log.info("GPU %s still unhealthy: %s", uuid, err)
                return False
        return True


def _pages_pending(nvml: HealthNvml, handle: object) -> bool:
    return bool(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))


def _rows_pending(nvml: HealthNvml, handle: object) -> bool:
    _corrected, _uncorrected, pending, failed = nvml.nvmlDeviceGetRemappedRows(handle)
    return bool(pending or failed)
