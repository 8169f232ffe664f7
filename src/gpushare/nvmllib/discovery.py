"""The node's GPUs as NVML lists them: the one discovery both node components use.

NVML comes injected (`Nvml`: the pynvml module in production, from `bindings()`; a
stand-in in tests), so no component imports pynvml and `--backend mock` runs without
a driver. Each backend types the further calls it makes as a protocol extending
`Nvml`, and turns an `NvmlGpu` into its own record: the device plugin into whole GiB
for the node's inventory, the agent into the devices whose processes it watches.
"""

import threading
from dataclasses import dataclass, field
from typing import Protocol


class MemoryInfo(Protocol):
    @property
    def total(self) -> int: ...


class Nvml(Protocol):
    """The pynvml calls discovery makes. Handles are NVML's opaque device handles."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int: ...

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...

    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes: ...

    def nvmlDeviceGetName(self, handle: object) -> str | bytes: ...

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> MemoryInfo: ...

    def nvmlDeviceGetMinorNumber(self, handle: object) -> int: ...


class NvmlUnavailable(RuntimeError):
    """NVML did not start or could not list the GPUs; the message says what to do."""


@dataclass(frozen=True, slots=True)
class NvmlGpu:
    index: int
    uuid: str
    model: str
    mem_bytes: int
    """Total memory as NVML reports it; each component rounds it to whole GiB itself."""
    minor: int
    """The N of /dev/nvidiaN."""
    handle: object = field(compare=False, repr=False)
    """NVML's handle of the device, for the calls a backend makes on it."""


class GpuDiscovery:
    """Starts NVML on first use (once, however many threads ask) and lists the GPUs."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self._started = False

    def discover(self) -> tuple[NvmlGpu, ...]:
        """The GPUs, ordered by index. Raises NvmlUnavailable saying what to do."""
        self._start()
        nvml = self._nvml
        try:
            return tuple(
                _gpu(nvml, index, nvml.nvmlDeviceGetHandleByIndex(index))
                for index in range(nvml.nvmlDeviceGetCount())
            )
        except nvml.NVMLError as err:
            raise NvmlUnavailable(_unavailable(err)) from err

    def close(self) -> None:
        """Shuts NVML down if this discovery started it."""
        with self._lock:
            if self._started:
                self._nvml.nvmlShutdown()
                self._started = False

    def _start(self) -> None:
        # nvmlInit counts its callers and each needs an nvmlShutdown: start once.
        with self._lock:
            if self._started:
                return
            try:
                self._nvml.nvmlInit()
            except self._nvml.NVMLError as err:
                raise NvmlUnavailable(_unavailable(err)) from err
            self._started = True


def text(value: str | bytes) -> str:
    """NVML's strings: bytes from older nvidia-ml-py releases, str from newer ones."""
    return value.decode() if isinstance(value, bytes) else value


def _gpu(nvml: Nvml, index: int, handle: object) -> NvmlGpu:
    return NvmlGpu(
        index=index,
        uuid=text(nvml.nvmlDeviceGetUUID(handle)),
        model=text(nvml.nvmlDeviceGetName(handle)),
        mem_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
        minor=nvml.nvmlDeviceGetMinorNumber(handle),
        handle=handle,
    )


def _unavailable(err: Exception) -> str:
    return (
        f"NVML is not available ({err}); run on a node with the NVIDIA driver and its "
        "libraries mounted, or use --backend mock --mock-gpus LAYOUT"
    )
