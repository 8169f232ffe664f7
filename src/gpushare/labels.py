"""Node labels that choose how a node shares its GPUs, and how pods are placed on it."""

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from gpushare.resources import RESOURCES

LABEL_SCHEDULE: Final = "ack.node.gpu.schedule"
LABEL_PLACEMENT: Final = "ack.node.gpu.placement"
LABEL_LEGACY_SHARE: Final = "gpushare"
LABEL_LEGACY_CGPU: Final = "cgpu"
LABEL_DISABLE_ISOLATION: Final = "cgpu.disable.isolation"


class NodeMode(StrEnum):
    SHARE = "share"
    CGPU = "cgpu"
    CORE_MEM = "core_mem"

    @property
    def advertised_resources(self) -> tuple[str, ...]:
        return tuple(
            r.name for r in RESOURCES if self is NodeMode.CORE_MEM or not r.needs_compute_isolation
        )

    @property
    def isolates_memory(self) -> bool:
        return self is not NodeMode.SHARE


def node_mode(labels: Mapping[str, str]) -> NodeMode | None:
    """The node's sharing mode, or None when the node is left to other plugins.

    `ack.node.gpu.schedule` wins over the legacy labels `gpushare=true` (share)
    and `cgpu=true` (cgpu); any other value of it means "not ours".
    """
    value = labels.get(LABEL_SCHEDULE)
    if value is not None:
        try:
            return NodeMode(value.strip().lower())
        except ValueError:
            return None
    if labels.get(LABEL_LEGACY_CGPU, "").lower() == "true":
        return NodeMode.CGPU
    if labels.get(LABEL_LEGACY_SHARE, "").lower() == "true":
        return NodeMode.SHARE
    return None


def isolation_disabled(mode: NodeMode | None, labels: Mapping[str, str]) -> bool:
    """True when containers on this node run without cGPU isolation (CGPU_DISABLE)."""
    if mode is None or not mode.isolates_memory:
        return True
    value = labels.get(LABEL_DISABLE_ISOLATION)
    return value is not None and value.lower() == "true"
