"""Publishes the node's GPUs (`gpushare.io/gpus`) for the extender, at start and
on every health change, retrying in the background while the API is away."""

import logging
import threading
from typing import Final

from gpushare.cluster import Cluster
from gpushare.inventory import NODE_GPUS_ANNOTATION, Gpu, encode_gpus

log = logging.getLogger(__name__)

RETRY: Final = 2.0


class InventoryPublisher:
    def __init__(self, cluster: Cluster, node_name: str) -> None:
        self._cluster = cluster
        self._node_name = node_name
        self._cond = threading.Condition()
        self._wanted: str | None = None
        self._written: str | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="inventory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def publish(self, gpus: tuple[Gpu, ...]) -> None:
        with self._cond:
            self._wanted = encode_gpus(gpus)
            self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Waits until the latest inventory is on the node; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._written == self._wanted, timeout)

    def _run(self) -> None:
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
                log.warning(
                    "publishing %s on node %s failed: %s; retrying in %.0fs",
                    NODE_GPUS_ANNOTATION,
                    self._node_name,
                    err,
                    RETRY,
                )
                with self._cond:
                    self._cond.wait_for(lambda: self._stopped, RETRY)
                continue
            with self._cond:
                self._written = value
                self._cond.notify_all()
            log.info("published %s on node %s", NODE_GPUS_ANNOTATION, self._node_name)
