"""The NVML GPU backend: real GPUs through nvidia-ml-py (import pynvml).

Discovery reads index, UUID, memory (in whole GiB by --gpu-memory-rounding, see
gpushare.inventory.gpu_mem_gib), model and minor number. Health follows the
driver's event set: a critical XID or a double-bit ECC error marks the GPU
unhealthy (application XIDs are ignored, see health.py), and a GPU that stays
quiet and passes a probe (reachable, memory readable, no retired pages or
remapped rows waiting for a reset) is marked healthy again.
"""

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import pynvml

from gpushare.deviceplugin.backends.health import DEFAULT_QUIET_PERIOD, XidHealth, is_critical_xid
from gpushare.deviceplugin.backends.port import DeviceNode, HealthListener, PhysicalGpu
from gpushare.inventory import Gpu, MemoryRounding, gpu_mem_gib

log = logging.getLogger(__name__)

CONTROL_DEVICES: Final = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
"""Device files every CUDA container needs besides its GPUs' /dev/nvidiaN."""

_WAIT_MS: Final = 1000
_WATCHED_EVENTS: Final = (
    pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class NvmlBackend:
    """dev_root: where this process sees the node's /dev, to tell which control device
    files the node has (the plugin's --dev-root)."""

    name = "nvml"

    def __init__(
        self,
        dev_root: Path = Path("/dev"),
        quiet_period: float = DEFAULT_QUIET_PERIOD,
        memory_rounding: MemoryRounding = MemoryRounding.UP,
    ) -> None:
        self._dev_root = dev_root
        self._quiet_period = quiet_period
        self.memory_rounding = memory_rounding
        self._init_lock = threading.Lock()
        self._initialised = False

    def discover(self) -> tuple[PhysicalGpu, ...]:
        self._init()
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpu = Gpu(
                index=index,
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                mem=gpu_mem_gib(int(memory.total), self.memory_rounding),
                model=_text(pynvml.nvmlDeviceGetName(handle)),
            )
            found.append(PhysicalGpu(gpu, pynvml.nvmlDeviceGetMinorNumber(handle)))
        return tuple(found)

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
        self._init()
        gpus = {g.gpu.uuid: g.gpu.index for g in self.discover()}
        health = XidHealth(self._quiet_period)
        events = pynvml.nvmlEventSetCreate()
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
                uuid = _text(pynvml.nvmlDeviceGetUUID(event.device))
                if uuid not in gpus:
                    continue
                xid = int(event.eventData)
                if event.eventType & pynvml.nvmlEventTypeDoubleBitEccError:
                    change = health.on_critical(gpus[uuid], "double-bit ECC error", now)
                elif is_critical_xid(xid):
                    change = health.on_xid(gpus[uuid], xid, now)
                else:
                    log.info("GPU %s: application XID %s ignored", uuid, xid)
                    continue
                if change is not None:
                    listener(change)
        finally:
            pynvml.nvmlEventSetFree(events)

    def _init(self) -> None:
        with self._init_lock:
            if self._initialised:
                return
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as err:
                raise RuntimeError(
                    f"NVML is not available ({err}); run on a node with the NVIDIA driver "
                    f"and its libraries mounted, or start with --backend mock"
                ) from err
            self._initialised = True

    def _register(self, events: Any, uuid: str) -> None:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        try:
            supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
            pynvml.nvmlDeviceRegisterEvents(handle, _WATCHED_EVENTS & supported, events)
        except pynvml.NVMLError as err:
            log.warning("GPU %s reports no health events (%s); it stays Healthy", uuid, err)

    def _wait(self, events: Any) -> Any:
        try:
            return pynvml.nvmlEventSetWait_v2(events, _WAIT_MS)
        except pynvml.NVMLError_Timeout:
            return None
        except pynvml.NVMLError as err:
            log.warning("waiting for NVML events failed: %s", err)
            time.sleep(_WAIT_MS / 1000)
            return None

    def _probe(self, uuid: str) -> bool:
        """True when the GPU answers and has no memory repair waiting for a reset."""
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            pynvml.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as err:
            log.info("GPU %s still unhealthy: %s", uuid, err)
            return False
        for check in (_pages_pending, _rows_pending):
            try:
                if check(handle):
                    return False
            except pynvml.NVMLError_NotSupported:
                continue
            except pynvml.NVMLError as err:
                log.info("GPU %s still unhealthy: %s", uuid, err)
                return False
        return True


def _pages_pending(handle: Any) -> bool:
    return bool(pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))


def _rows_pending(handle: Any) -> bool:
    _corrected, _uncorrected, pending, failed = pynvml.nvmlDeviceGetRemappedRows(handle)
    return bool(pending or failed)
