"""The node's GPUs reach the API even when it is away for a while: the publisher
retries, backing off, until the inventory is on the node."""

import time
from collections.abc import Mapping

from gpushare.backoff import Backoff
from gpushare.cluster import ClusterError
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.deviceplugin.publisher import InventoryPublisher
from gpushare.inventory import NODE_GPUS_ANNOTATION, encode_gpus, parse_layout
from gpushare.objects import Node
from tests.deviceplugin.rig import WAIT


class Unreachable(MemoryCluster):
    """Refuses the first `failures` node patches."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.tries: list[float] = []

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> Node:
        self.tries.append(time.monotonic())
        if len(self.tries) <= self.failures:
            raise ClusterError("connection refused")
        return super().patch_node_annotations(name, annotations)


def test_the_inventory_is_published_once_the_api_is_back():
    gpus = parse_layout("2x16GiB", "n1")
    cluster = Unreachable(failures=3)
    cluster.add_node(gpu_node("n1", gpus))
    backoff = Backoff(initial=0.05, maximum=0.1, jitter=0)
    publisher = InventoryPublisher(cluster, "n1", backoff)
    publisher.start()
    try:
        publisher.publish(gpus)
        assert publisher.flush(WAIT)
    finally:
        publisher.stop()

    assert cluster.get_node("n1").metadata.annotations[NODE_GPUS_ANNOTATION] == encode_gpus(gpus)
    gaps = [b - a for a, b in zip(cluster.tries, cluster.tries[1:], strict=False)]
    assert len(gaps) == 3
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.1
