"""The tree view: what the control tree shows now, put together from the agent's parts
(the GPUs, the roster, the settings and the memory caps); the codec turns it into files."""

from collections.abc import Callable, Mapping, Sequence

from gpushare.isolation.backends.port import GIB, GpuDevice
from gpushare.isolation.memory import MemoryCapEnforcer
from gpushare.isolation.roster import ContainerRoster, Usage
from gpushare.isolation.settings import SettingsStore
from gpushare.isolation.slicer import tenants
from gpushare.isolation.timeslice import promised_shares
from gpushare.isolation.treecodec import ContainerEntry, GpuEntry, ProcessMemory, TreeContent


class TreeView:
    def __init__(
        self,
        version: str,
        devices: Sequence[GpuDevice],
        settings: SettingsStore,
        roster: ContainerRoster,
        memory: MemoryCapEnforcer,
        interposed: Callable[[str], bool] = lambda key: False,
    ) -> None:
        self._interposed = interposed
        self._version = version
        self._devices = devices
        self._settings = settings
        self._roster = roster
        self._memory = memory

    def content(self) -> TreeContent:
        return TreeContent(
            version=self._version,
            default_memsize=0,
            gpus=tuple(self._gpu_entry(device) for device in self._devices),
        )

    def _gpu_entry(self, device: GpuDevice) -> GpuEntry:
        index = device.index
        settings = self._settings.settings(index)
        promised = promised_shares(settings, tenants(index, self._settings, self._roster))
        grants = self._settings.grants(index)
        containers = tuple(
            self._container_entry(index, key, usage, grants.get(key, 0), promised)
            for key, usage in self._roster.members(index).items()
        )
        return GpuEntry(
            index=index,
            uuid=device.uuid,
            model=device.model,
            # The GiB the node advertises for this GPU (rounded as the plugin rounds it),
            # so cgpu-smi shows a T4 as the 15 GiB its pods were given, not 14.76.
            mem_bytes=device.mem_gib * GIB,
            policy=settings.policy,
            max_inst=settings.max_inst,
            prio_ratio=settings.prio_ratio,
            free_weight=self._settings.free_weight(index),
            major=device.major,
            util=min(100.0, sum(c.util or 0.0 for c in containers)),
            containers=containers,
        )

    def _container_entry(
        self,
        index: int,
        key: str,
        usage: Usage,
        weight: int,
        promised: Mapping[str, float | None],
    ) -> ContainerEntry:
        known = self._roster.known(key)
        assert known is not None, "a GPU's members are known containers"
        seen = known.seen
        share = promised.get(key)
        processes = seen.on(index) if known.present else ()
        return ContainerEntry(
            id=key,
            pod=seen.pod,
            name=seen.limits.container,
            memsize=seen.cap_bytes(index) or 0,
            processes=tuple(ProcessMemory(p.pid, p.mem_bytes) for p in processes),
            weight=weight,
            highprio=self._settings.containers(index)[key].high_priority,
            util=usage.shown_util,
            limit=None if share is None else 100 * share,
            violations=self._memory.violations(key, index),
            interposer=self._interposed(key),
        )
