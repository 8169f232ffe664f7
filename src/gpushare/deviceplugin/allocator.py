"""Answers the kubelet's GetPreferredAllocation and Allocate for every resource.

Allocate matches the call to its container (admission.py), answers with the
cGPU environment contract and the GPUs' device files, records the grant for
reconciliation and has the container marked assigned. GetPreferredAllocation
looks at the same container and prefers IDs of the GPUs the extender chose, so
the kubelet's records name the real GPU.

Both are answered within their deadline (deadline.py). The kubelet calls
Allocate right after GetPreferredAllocation for the same container, so an
Allocate that follows a GetPreferredAllocation which waited in vain continues
that call's deadline instead of waiting as long again.
"""

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from queue import SimpleQueue
from typing import Final

from gpushare.allocation import ContainerAllocation
from gpushare.deviceplugin.admission import (
    AdmissionQueue,
    CallEnded,
    NoMatch,
    QueueBusy,
    WaitingContainer,
)
from gpushare.deviceplugin.assignment import AssignmentWriter
from gpushare.deviceplugin.deadline import ANSWER_WITHIN_S, Deadline
from gpushare.deviceplugin.devices import preferred_ids
from gpushare.deviceplugin.journal import Grant, GrantJournal
from gpushare.deviceplugin.metrics import Call, PluginMetrics, Refusal
from gpushare.deviceplugin.node import LocalNode, NodeSnapshot
from gpushare.deviceplugin.worker import start_daemon
from gpushare.environment import (
    CORE_PERCENTAGE,
    container_env,
    isolated_at_the_call,
    limits_from_env,
)
from gpushare.gpunode.backends.port import DeviceBackend
from gpushare.gpunode.interposer import Injection, InterposerMounts, grant_mounted
from gpushare.grant import GrantError
from gpushare.kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
from gpushare.objects import Pod
from gpushare.resources import GPU_CORE, RESOURCE

log = logging.getLogger(__name__)


Defer = Callable[[Callable[[], None]], None]
"""Runs a step once the answer has been sent."""

_SAME_CONTAINER_S: Final = 1.0
"""An Allocate this soon after a GetPreferredAllocation of the same count and
resource is for the same container."""


def _always() -> bool:
    return True


class AllocationRefused(Exception):
    """The call cannot be answered; the message goes back to the kubelet as is."""


class AnswerTimeout(AllocationRefused):
    """Something other than the pod watch held the call until its deadline."""


class FollowUps:
    """Runs what follows an answer (the journal's line, waking the annotation
    writer and the reconciler, the log line) on a thread of its own.

    gRPC runs end-of-call callbacks on the server's one polling thread, the
    thread that also hands every new call to a handler: a step that blocked there
    (a slow disk, a held lock) would leave every later call of that server
    unanswered, with nothing in the log. The callback only hands the step over
    (SimpleQueue.put never blocks)."""

    def __init__(self) -> None:
        self._steps: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, step: Callable[[], None]) -> None:
        self._steps.put(step)

    def start(self) -> None:
        self._thread = start_daemon("follow-ups", self._run)

    def stop(self) -> None:
        """Runs the steps handed over so far, then ends the thread."""
        self._steps.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while (step := self._steps.get()) is not None:
            try:
                step()
            except Exception:
                log.exception("a step after an Allocate answer failed")


@dataclass(frozen=True, slots=True)
class _GaveUp:
    """A GetPreferredAllocation that waited in vain, for the Allocate that follows."""

    resource: str
    count: int
    deadline: Deadline
    at: float


class Allocator:
    def __init__(
        self,
        node: LocalNode,
        queue: AdmissionQueue,
        backend: DeviceBackend,
        assignments: AssignmentWriter,
        journal: GrantJournal,
        metrics: PluginMetrics,
        on_granted: Callable[[], None] = lambda: None,
        answer_within: float = ANSWER_WITHIN_S,
        watch_trouble: Callable[[], str | None] = lambda: None,
        interposer: InterposerMounts | None = None,
    ) -> None:
        self._interposer = interposer
        self._node = node
        self._queue = queue
        self._backend = backend
        self._assignments = assignments
        self._journal = journal
        self._metrics = metrics
        self._on_granted = on_granted
        self.answer_within = answer_within
        self._watch_trouble = watch_trouble
        self._gave_up: _GaveUp | None = None
        self.follow_ups = FollowUps()

    def preferred(
        self,
        resource: str,
        request: pb.ContainerPreferredAllocationRequest,
        active: Callable[[], bool] = _always,
    ) -> list[str]:
        """IDs of the GPUs the extender chose for the container the call is for;
        none (the kubelet then picks) when no such container shows up in time: an
        error here would fail the pod (docs/contracts.md#getpreferredallocation)."""
        count = request.allocation_size
        deadline = Deadline.after(self.answer_within)
        try:
            waiting = self._queue.peek(resource, count, deadline, active)
        except QueueBusy as busy:
            waiting, why = None, str(busy)
        else:
            why = (
                f"no bound pod asks for it after {deadline.budget:g} s of waiting for the "
                f"API watch{self._trouble()}"
            )
        if waiting is None:
            if active():
                self._gave_up = _GaveUp(resource, count, deadline, time.monotonic())
                self._metrics.timed_out(Call.GET_PREFERRED_ALLOCATION, resource)
                log.warning(
                    "GetPreferredAllocation for %d %s on node %s: %s; answering without a "
                    "preference",
                    count,
                    resource,
                    self._queue.node_name,
                    why,
                )
            return []
        wanted = [(s.index, RESOURCE[resource].units(s)) for s in waiting.container.gpus]
        return preferred_ids(
            self._node.snapshot().catalog,
            wanted,
            list(request.available_deviceIDs),
            list(request.must_include_deviceIDs),
            request.allocation_size,
        )

    def allocate(
        self,
        resource: str,
        device_ids: Sequence[str],
        defer: Defer | None = None,
        active: Callable[[], bool] = _always,
    ) -> pb.ContainerAllocateResponse:
        """The answer for one container. What can wait (the journal's file line,
        waking the annotation writer and the reconciler, the log line) is handed to
        `defer` to run once the answer has left (gRPC's end-of-call callback, which
        hands it to `follow_ups`), or done before returning without one. Those steps
        release the interpreter (file writes) or wake threads that want it, and on a
        busy node the call would then wait milliseconds to get it back.

        Raises AllocationRefused; AnswerTimeout when the deadline passed waiting for
        something other than the pod watch."""
        started = time.perf_counter()
        if not device_ids:
            self._metrics.refused(resource, Refusal.NO_DEVICES)
            raise AllocationRefused(f"Allocate for {resource} carried no device IDs")
        snapshot = self._node.snapshot()
        deadline = self._deadline(resource, len(device_ids))
        try:
            match = self._queue.take(
                resource,
                len(device_ids),
                snapshot.advertised,
                self._journal.answered(resource, device_ids),
                deadline,
                active,
            )
        except NoMatch as err:
            self._metrics.refused(resource, Refusal.NO_MATCH)
            self._metrics.timed_out(Call.ALLOCATE, resource)  # take() waited until the deadline
            raise AllocationRefused(f"{err}{self._trouble()}") from None
        except QueueBusy as busy:
            self._metrics.refused(resource, Refusal.TIMEOUT)
            self._metrics.timed_out(Call.ALLOCATE, resource)
            raise AnswerTimeout(
                f"Allocate for {len(device_ids)} {resource} on node {self._queue.node_name} "
                f"gave up: {busy}"
            ) from None
        except CallEnded as ended:
            raise AllocationRefused(f"{ended} (kubelet restart?); no container taken") from None
        matched = time.perf_counter() - started
        waiting = match.waiting
        response = container_response(resource, waiting, snapshot, self._backend, self._interposer)
        self._journal.record(
            Grant(
                resource,
                frozenset(device_ids),
                waiting.pod.metadata.uid,
                waiting.pod.key,
                waiting.container.name,
                waiting.container.gpus,
                interposer_grant=grant_mounted(response.mounts),
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
            if self._interposer is not None:
                self._interposer.prune(self._queue.uids())
            self._journal.write()
            self._assignments.wake()
            log.info(*message)
            self._on_granted()

        if defer is None:
            after_answer()
        else:
            defer(after_answer)
        return response

    def _deadline(self, resource: str, count: int) -> Deadline:
        """This call's deadline: that of the GetPreferredAllocation just before it
        for the same container when that one waited in vain, else a fresh one."""
        gave_up, self._gave_up = self._gave_up, None
        if (
            gave_up is not None
            and (gave_up.resource, gave_up.count) == (resource, count)
            and time.monotonic() - gave_up.at < _SAME_CONTAINER_S
        ):
            return gave_up.deadline
        return Deadline.after(self.answer_within)

    def _trouble(self) -> str:
        """What the refusal adds when the pod watch is not followed: then the pod
        may well be bound, and the operator should look at the API connection."""
        trouble = self._watch_trouble()
        return f"; the pod watch is not working ({trouble})" if trouble else ""


def container_response(
    resource: str,
    waiting: WaitingContainer,
    snapshot: NodeSnapshot,
    backend: DeviceBackend,
    interposer: InterposerMounts | None = None,
) -> pb.ContainerAllocateResponse:
    """The answer for one container and one resource.

    A container with gpu-mem and gpu-core gets two answers that the kubelet
    merges, keeping the first value of a key it sees twice
    (docs/contracts.md#merging-allocate-answers): the core
    answer carries only the compute percentage, the memory answer everything
    else. Device files come with the memory or whole-GPU answer.
    """
    container = _on_node_gpus(waiting.container, snapshot)
    env = container_env(waiting.pod, waiting.allocation, container, snapshot.isolation_disabled)
    if resource == GPU_CORE:
        return pb.ContainerAllocateResponse(envs={CORE_PERCENTAGE: env[CORE_PERCENTAGE]})
    if GPU_CORE in waiting.requests and GPU_CORE in snapshot.advertised:
        del env[CORE_PERCENTAGE]
    injection = (
        _injection(interposer, waiting.pod, container, env)
        if interposer is not None and isolated_at_the_call(waiting.pod, container, env)
        else None
    )
    indices = tuple(s.index for s in container.gpus)
    nodes = backend.device_nodes(snapshot.physical(indices))
    return pb.ContainerAllocateResponse(
        envs={**env, **(injection.env if injection else {})},
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in (injection.mounts if injection else ())
        ],
        devices=[
            pb.DeviceSpec(
                container_path=n.container_path, host_path=n.host_path, permissions=n.permissions
            )
            for n in nodes
        ],
    )


def _injection(
    interposer: InterposerMounts, pod: Pod, container: ContainerAllocation, env: dict[str, str]
) -> Injection | None:
    """The interposer's mounts for the container; None, logged, when its grant or
    accounting directory cannot be made: the container then starts without the
    interposer and the agent enforces its cap after the fact, rather than the pod failing
    to start."""
    limits = limits_from_env(env)
    if limits is None:  # container_env always sets the cap; typed as optional
        return None
    # The compute percentage goes in the grant even where the core answer carries it.
    core = tuple(0 if container.exclusive else s.core for s in container.gpus)
    try:
        return interposer.for_container(pod.metadata.uid, replace(limits, core_percent=core))
    except (OSError, GrantError) as err:
        log.warning(
            "%s container %s starts without the CUDA interposer: %s", pod.key, container.name, err
        )
        return None


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
