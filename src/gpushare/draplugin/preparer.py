"""Prepare and Unprepare: a claim's allocation to what a device-plugin container gets.

For each claim the kubelet sends, the driver reads the claim (the call carries only its
namespace, name and UID: DRA-INTERFACES §3, §6), takes the results that name this
driver, and turns them into the allocation record the device plugin would have made
(`dra.claims.pod_allocation`). From that record each request's container gets the
cGPU environment (`environment.container_env`), the CUDA interposer's mounts and grant
where its memory is capped, and the GPUs' device files, as a CDI spec. The claim is
recorded in the books (on disk) before the answer leaves.

A claim is prepared once: a repeated call (the kubelet retries, and prepares again after
its restart) gets the recorded answer. A claim whose allocation does not fit beside the
claims prepared on the node is refused with the numbers (`books.OverCommitted`).
"""

import logging
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from gpushare import annotation
from gpushare.allocation import ContainerAllocation, PodAllocation
from gpushare.cluster import Cluster, ClusterError, DraCluster, NotFound
from gpushare.dra.claims import (
    DRIVER,
    AllocationError,
    DeviceResult,
    container_places,
    pod_allocation,
)
from gpushare.dra.objects import ResourceClaim, quantity_units
from gpushare.draplugin import cdi
from gpushare.draplugin.books import Answer, OverCommitted, PreparedClaim, PreparedClaims
from gpushare.draplugin.metrics import DriverMetrics, Outcome
from gpushare.draplugin.node import DriverNode, NodeSnapshot
from gpushare.draplugin.server import ClaimRef, PreparedDevice, PrepareResult
from gpushare.environment import container_env, isolated_at_the_call, limits_from_env
from gpushare.gpunode.backends.port import DeviceBackend
from gpushare.gpunode.interposer import InterposerMounts, Mount
from gpushare.grant import GrantError
from gpushare.objects import Pod

log = logging.getLogger(__name__)


class PrepareError(Exception):
    """The claim cannot be prepared; the message goes to the kubelet (and the pod's
    FailedPrepareDynamicResources event) as is."""


class OverCommit(PrepareError):
    """The claim does not fit beside those prepared on the node."""


class Preparer:
    def __init__(
        self,
        node: DriverNode,
        cluster: Cluster,
        dra: DraCluster,
        books: PreparedClaims,
        backend: DeviceBackend,
        cdi_dir: Path,
        interposer: InterposerMounts | None = None,
        metrics: DriverMetrics | None = None,
    ) -> None:
        self._metrics = metrics or DriverMetrics(node.snapshot().name)
        self._node = node
        self._cluster = cluster
        self._dra = dra
        self._books = books
        self._backend = backend
        self._cdi_dir = cdi_dir
        self._interposer = interposer
        # One claim at a time: the fit check and the record must see each other's claims.
        self._lock = threading.Lock()

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        for ref in claims:
            try:
                with self._lock:
                    prepared = self._prepare(ref)
            except PrepareError as err:
                log.warning("claim %s/%s not prepared: %s", ref.namespace, ref.name, err)
                self._metrics.prepared(
                    Outcome.OVER_COMMIT if isinstance(err, OverCommit) else Outcome.ERROR
                )
                results[ref.uid] = PrepareResult(error=str(err))
                continue
            results[ref.uid] = PrepareResult(devices=tuple(_device(a) for a in prepared.answers))
        return results

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        errors: dict[str, str] = {}
        for ref in claims:
            try:
                with self._lock:
                    self._unprepare(ref)
                errors[ref.uid] = ""
                self._metrics.unprepared()
            except OSError as err:
                errors[ref.uid] = f"claim {ref.namespace}/{ref.name}: {err}"
        return errors

    def _prepare(self, ref: ClaimRef) -> PreparedClaim:
        known = self._books.get(ref.uid)
        if known is not None and not known.recovered:
            self._metrics.prepared(Outcome.REPEATED)
            return known
        claim = self._claim(ref)
        pod = self._pod(claim)
        snapshot = self._node.snapshot()
        results = _results(claim, snapshot.name)
        try:
            allocation = pod_allocation(
                results,
                snapshot.by_index(),
                snapshot.name,
                datetime.now(UTC),
                lambda request: pod.claim_users(claim.metadata.name, request),
                container_places(pod),
            )
        except AllocationError as err:
            raise PrepareError(f"claim {claim.key}: {err}") from None
        requests = list(dict.fromkeys(r.request for r in results))
        record = PreparedClaim(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            pod_uid=pod.metadata.uid,
            containers=allocation.containers,
        )
        try:
            self._books.check_fits(record, snapshot.by_index())
        except OverCommitted as err:
            raise OverCommit(
                f"claim {claim.key} would over-commit a GPU of node {snapshot.name} ({err}): "
                "the scheduler's view and the node's disagree; it is refused rather than "
                "given capacity another container holds"
            ) from None
        cdi_ids = {
            request: self._write_spec(ref.uid, request, pod, allocation, container, snapshot)
            for request, container in zip(requests, allocation.containers, strict=True)
        }
        answers = tuple(
            Answer(
                request_names=(r.request,),
                pool=snapshot.name,
                device=r.device,
                cdi_ids=(cdi_ids[r.request],),
                share_id=r.share_id,
            )
            for r in results
        )
        record = record.model_copy(update={"answers": answers})
        self._books.put(record)
        self._metrics.prepared(Outcome.PREPARED)
        self._annotate(pod, allocation)
        log.info(
            "prepared claim %s for pod %s: %s",
            claim.key,
            pod.key,
            ", ".join(f"{r.request} on {r.device}" for r in results),
        )
        return record

    def _annotate(self, pod: Pod, allocation: PodAllocation) -> None:
        """Writes the allocation record on the pod, as the device plugin's pods carry
        it, so `kubectl inspect cgpu` and cgpu-smi show DRA pods alike. The claim is the
        allocation: a write that fails is logged and the claim stays prepared."""
        record = allocation.with_assigned(c.name for c in allocation.containers)
        try:
            self._cluster.patch_pod_annotations(
                pod.metadata.namespace, pod.metadata.name, annotation.encode(record)
            )
        except ClusterError as err:
            log.warning("the allocation record of pod %s was not written: %s", pod.key, err)

    def _unprepare(self, ref: ClaimRef) -> None:
        removed = cdi.remove_specs(self._cdi_dir, ref.uid)
        gone = self._books.remove(ref.uid)
        if self._interposer is not None:
            self._interposer.prune({c.pod_uid for c in self._books.claims() if c.pod_uid})
        if gone is not None or removed:
            log.info("unprepared claim %s/%s", ref.namespace, ref.name)

    def _claim(self, ref: ClaimRef) -> ResourceClaim:
        try:
            claim = self._dra.get_resource_claim(ref.namespace, ref.name)
        except NotFound:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} does not exist") from None
        except ClusterError as err:
            raise PrepareError(f"claim {ref.namespace}/{ref.name} cannot be read: {err}") from None
        if claim.metadata.uid != ref.uid:
            raise PrepareError(
                f"claim {claim.key} is now UID {claim.metadata.uid}, not {ref.uid} (recreated)"
            )
        if claim.status.allocation is None:
            raise PrepareError(f"claim {claim.key} is not allocated")
        return claim

    def _pod(self, claim: ResourceClaim) -> Pod:
        reserved = [r for r in claim.status.reserved_for if r.resource == "pods"]
        if not reserved:
            raise PrepareError(f"claim {claim.key} is reserved for no pod")
        ref = reserved[0]
        namespace = claim.metadata.namespace or ""
        try:
            pod = self._cluster.get_pod(namespace, ref.name)
        except ClusterError as err:
            raise PrepareError(
                f"pod {namespace}/{ref.name} of claim {claim.key} cannot be read: {err}"
            ) from None
        if pod.metadata.uid != ref.uid:
            raise PrepareError(f"pod {pod.key} is not the pod claim {claim.key} is reserved for")
        return pod

    def _write_spec(
        self,
        claim_uid: str,
        request: str,
        pod: Pod,
        allocation: PodAllocation,
        container: ContainerAllocation,
        snapshot: NodeSnapshot,
    ) -> str:
        env = container_env(pod, allocation, container, snapshot.isolation_disabled)
        mounts: tuple[Mount, ...] = ()
        if self._interposer is not None and isolated_at_the_call(pod, container, env):
            limits = limits_from_env(env)
            try:
                injection = (
                    self._interposer.for_container(pod.metadata.uid, limits) if limits else None
                )
            except (OSError, GrantError) as err:
                log.warning(
                    "%s container %s starts without the CUDA interposer: %s",
                    pod.key,
                    container.name,
                    err,
                )
                injection = None
            if injection is not None:
                env = {**env, **injection.env}
                mounts = injection.mounts
        nodes = self._backend.device_nodes(
            snapshot.physical_of(tuple(s.index for s in container.gpus))
        )
        edits = cdi.ContainerEdits(env=env, mounts=mounts, device_nodes=tuple(nodes))
        try:
            return cdi.write_spec(self._cdi_dir, claim_uid, request, edits)
        except OSError as err:
            raise PrepareError(f"the CDI spec of {request!r} cannot be written: {err}") from None


def _results(claim: ResourceClaim, node: str) -> list[DeviceResult]:
    results = []
    for r in claim.results_for(DRIVER):
        if r.pool != node:
            raise PrepareError(
                f"claim {claim.key}: device {r.device} of pool {r.pool} is not on node {node}"
            )
        consumed = r.consumed_capacity
        try:
            results.append(
                DeviceResult(
                    request=r.request.split("/", 1)[0],
                    device=r.device,
                    share_id=r.share_id,
                    memory_bytes=_units(consumed.get("memory")),
                    cores=_units(consumed.get("cores")),
                    shares=_units(consumed.get("shares")),
                )
            )
        except ValueError as err:
            raise PrepareError(f"claim {claim.key}: {err}") from None
    if not results:
        raise PrepareError(f"claim {claim.key} has no device of driver {DRIVER}")
    return results


def _units(quantity: str | None) -> int | None:
    return None if quantity is None else quantity_units(quantity)


def _device(answer: Answer) -> PreparedDevice:
    return PreparedDevice(
        request_names=answer.request_names,
        pool_name=answer.pool,
        device_name=answer.device,
        cdi_device_ids=answer.cdi_ids,
        share_id=answer.share_id,
    )
