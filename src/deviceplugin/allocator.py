"""Answers the kubelet's GetPreferredAllocation and Allocate for every resource.

Allocate matches the call to its container (admission.py), answers with the
cGPU environment contract and the GPUs' device files, records the grant for
reconciliation and has the container marked assigned. GetPreferredAllocation
looks at the same container and prefers IDs of the GPUs the extender chose, so
the kubelet's records name the real GPU.
"""

import logging
import time
from collections.abc import Callable, Sequence

from deviceplugin.admission import AdmissionQueue, NoMatch, WaitingContainer
from deviceplugin.api.kubelet.deviceplugin.v1beta1 import api_pb2 as pb
from deviceplugin.assignment import AssignmentWriter
from deviceplugin.devices import preferred_ids
from deviceplugin.gpus import GpuBackend
from deviceplugin.journal import Grant, GrantJournal
from deviceplugin.metrics import PluginMetrics
from deviceplugin.node import LocalNode, NodeSnapshot
from gpushare.allocation import ContainerAllocation, GpuSlice
from gpushare.environment import CORE_PERCENTAGE, container_env
from gpushare.resources import GPU_CORE, GPU_COUNT

log = logging.getLogger(__name__)


Defer = Callable[[Callable[[], None]], None]
"""Runs a step once the answer has been sent."""


class AllocationRefused(Exception):
    """The call cannot be answered; the message goes back to the kubelet as is."""


class Allocator:
    def __init__(
        self,
        node: LocalNode,
        queue: AdmissionQueue,
        backend: GpuBackend,
        assignments: AssignmentWriter,
        journal: GrantJournal,
        metrics: PluginMetrics,
        on_granted: Callable[[], None] = lambda: None,
        match_wait: float = 3.0,
    ) -> None:
        self._node = node
        self._queue = queue
        self._backend = backend
        self._assignments = assignments
        self._journal = journal
        self._metrics = metrics
        self._on_granted = on_granted
        self._match_wait = match_wait

    def preferred(
        self, resource: str, request: pb.ContainerPreferredAllocationRequest
    ) -> list[str]:
        waiting = self._queue.peek(resource, request.allocation_size, self._match_wait)
        if waiting is None:
            return []
        wanted = [(s.index, _units(resource, s)) for s in waiting.container.gpus]
        return preferred_ids(
            self._node.snapshot().catalog,
            wanted,
            list(request.available_deviceIDs),
            list(request.must_include_deviceIDs),
            request.allocation_size,
        )

    def allocate(
        self, resource: str, device_ids: Sequence[str], defer: Defer | None = None
    ) -> pb.ContainerAllocateResponse:
        """The answer for one container. What can wait (the journal's file line,
        waking the annotation writer and the reconciler, the log line) is handed to
        `defer` to run once the answer has left (gRPC's end-of-call callback), or
        done before returning without one. Those steps release the interpreter
        (file writes) or wake threads that want it, and on a busy node the call
        would then wait milliseconds to get it back."""
        started = time.perf_counter()
        if not device_ids:
            self._metrics.refused(resource, "no-devices")
            raise AllocationRefused(f"Allocate for {resource} carried no device IDs")
        snapshot = self._node.snapshot()
        try:
            match = self._queue.take(
                resource,
                len(device_ids),
                snapshot.advertised,
                self._journal.answered(resource, device_ids),
                self._match_wait,
            )
        except NoMatch as err:
            self._metrics.refused(resource, "no-match")
            raise AllocationRefused(str(err)) from None
        matched = time.perf_counter() - started
        waiting = match.waiting
        response = container_response(resource, waiting, snapshot, self._backend)
        self._journal.record(
            Grant(
                resource,
                frozenset(device_ids),
                waiting.pod.metadata.uid,
                waiting.pod.key,
                waiting.container.name,
                waiting.container.gpus,
            )
        )
        if match.complete and not match.reallocation:
            self._assignments.queue(waiting.pod, waiting.container.name)
        self._metrics.allocated(resource, matched)
        message = (
            "Allocate %d %s -> %s container %s on GPU %s%s",
            len(device_ids),
            resource,
            waiting.pod.key,
            waiting.container.name,
            ",".join(str(s.index) for s in waiting.container.gpus),
            " (asked again with the same IDs)" if match.reallocation else "",
        )

        def after_answer() -> None:
            self._journal.write()
            self._assignments.wake()
            log.info(*message)
            self._on_granted()

        if defer is None:
            after_answer()
        else:
            defer(after_answer)
        return response


def container_response(
    resource: str, waiting: WaitingContainer, snapshot: NodeSnapshot, backend: GpuBackend
) -> pb.ContainerAllocateResponse:
    """The answer for one container and one resource.

    A container with gpu-mem and gpu-core gets two answers that the kubelet
    merges, keeping the first value of a key it sees twice (A.10): the core
    answer carries only the compute percentage, the memory answer everything
    else. Device files come with the memory or whole-GPU answer.
    """
    container = _on_node_gpus(waiting.container, snapshot)
    env = container_env(waiting.pod, waiting.allocation, container, snapshot.isolation_disabled)
    if resource == GPU_CORE:
        return pb.ContainerAllocateResponse(envs={CORE_PERCENTAGE: env[CORE_PERCENTAGE]})
    if GPU_CORE in waiting.requests and GPU_CORE in snapshot.advertised:
        del env[CORE_PERCENTAGE]
    indices = tuple(s.index for s in container.gpus)
    nodes = backend.device_nodes(snapshot.physical(indices))
    return pb.ContainerAllocateResponse(
        envs=env,
        devices=[
            pb.DeviceSpec(
                container_path=n.container_path, host_path=n.host_path, permissions=n.permissions
            )
            for n in nodes
        ],
    )


def _on_node_gpus(container: ContainerAllocation, snapshot: NodeSnapshot) -> ContainerAllocation:
    """Fills in the UUID and size of each GPU where the allocation lacks them: pods
    placed by ACK's scheduler record GPU indices only."""
    if all(s.uuid and s.gpu_mem for s in container.gpus):
        return container
    gpus = {g.index: g for g in snapshot.inventory}
    slices = tuple(
        s.model_copy(
            update={"uuid": s.uuid or gpus[s.index].uuid, "gpu_mem": s.gpu_mem or gpus[s.index].mem}
        )
        if s.index in gpus
        else s
        for s in container.gpus
    )
    return container.model_copy(update={"gpus": slices})


def _units(resource: str, gpu_slice: GpuSlice) -> int:
    """Device IDs of `resource` the container holds on one of its GPUs."""
    if resource == GPU_CORE:
        return gpu_slice.core
    if resource == GPU_COUNT:
        return 1
    return gpu_slice.mem
