"""Publishes the node's GPUs (`gpushare.io/gpus`) for the extender, at start and
on every health change, retrying in the background while the API is away."""

import logging
from typing import Final

from gpushare.backoff import Backoff
from gpushare.cluster import Cluster
from gpushare.deviceplugin.worker import Worker
from gpushare.inventory import NODE_GPUS_ANNOTATION, Gpu, encode_gpus

log = logging.getLogger(__name__)

PUBLISH_BACKOFF: Final = Backoff(initial=1.0, maximum=30.0)


class InventoryPublisher(Worker):
    def __init__(
        self, cluster: Cluster, node_name: str, backoff: Backoff = PUBLISH_BACKOFF
    ) -> None:
        super().__init__("inventory")
        self._cluster = cluster
        self._node_name = node_name
        self._backoff = backoff
        self._wanted: str | None = None
        self._written: str | None = None

    def publish(self, gpus: tuple[Gpu, ...]) -> None:
        with self._cond:
            self._wanted = encode_gpus(gpus)
            self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Waits until the latest inventory is on the node; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._written == self._wanted, timeout)

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopped or self._wanted != self._written)
                if self._stopped:
                    return
                value = self._wanted
            assert value is not None
            try:
                self._cluster.patch_node_annotations(self._node_name, {NODE_GPUS_ANNOTATION: value})
            except Exception as err:
                failures += 1
                delay = self._backoff.delay(failures)
                log.warning(
                    "publishing %s on node %s failed: %s; retrying in %.1fs",
                    NODE_GPUS_ANNOTATION,
                    self._node_name,
                    err,
                    delay,
                )
                with self._cond:
                    self._cond.wait_for(lambda: self._stopped, delay)
                continue
            failures = 0
            with self._cond:
                self._written = value
                self._cond.notify_all()
            log.info("published %s on node %s", NODE_GPUS_ANNOTATION, self._node_name)
