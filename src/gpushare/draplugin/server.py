"""The DRA node service (DRA-INTERFACES §2, §3): `v1.DRAPlugin` and `v1beta1.DRAPlugin`
on one unix socket, `<plugins>/<driver>/dra.sock`, delegating to a ClaimPreparer.

The kubelet trusts an answer only when it has an entry for every claim UID it sent and
none other; a top-level gRPC error makes it ignore the whole answer. So every claim sent
is answered, here, whatever the preparer does: a claim it leaves out, or every claim of a
call it raised in, gets an error of its own, and so does a claim the request leaves a
field of empty (a claim without a UID under the key ""). v1 carries a device's share_id,
v1beta1 (Kubernetes 1.34) has no such field.
"""

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final, Protocol, TypeVar

import grpc

from gpushare.draplugin.health import MAX_STREAMS, SERVICE, HealthService
from gpushare.draplugin.unixserver import UnixServer
from gpushare.kubeletapi.dra.health.v1alpha1 import api_pb2_grpc as health_grpc
from gpushare.kubeletapi.dra.v1 import api_pb2 as dra1
from gpushare.kubeletapi.dra.v1 import api_pb2_grpc as dra1_grpc
from gpushare.kubeletapi.dra.v1beta1 import api_pb2 as dra1beta1
from gpushare.kubeletapi.dra.v1beta1 import api_pb2_grpc as dra1beta1_grpc

log = logging.getLogger(__name__)
_T = TypeVar("_T")

WORKERS: Final = 4
"""Calls for different pods may come at once (§3); a few at a time is plenty (the
health streams get workers of their own)."""
MAX_CALLS: Final = 64
"""Calls running or waiting for a worker; beyond: RESOURCE_EXHAUSTED, which the kubelet
retries at the pod's next sync."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    """Empty: the device serves every request of the claim."""
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None
    """The allocation's shareID on a shared device; sent only on v1."""


@dataclass(frozen=True, slots=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
    """Non-empty: the claim failed and its devices do not count."""


class ClaimPreparer(Protocol):
    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        """Results keyed by claim UID. Must be idempotent (the kubelet repeats calls)."""
        ...

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """Errors keyed by claim UID; "" when unprepared (or never prepared)."""
        ...


def dra_socket(plugins_dir: Path, driver: str) -> Path:
    return plugins_dir / driver / "dra.sock"


class _WireClaim(Protocol):
    """A Claim message of either version."""

    namespace: str
    uid: str
    name: str


class ClaimService:
    """What both versions answer, before it becomes messages: one entry per claim sent."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self._preparer = preparer

    def prepare(self, wire: Iterable[_WireClaim]) -> dict[str, PrepareResult]:
        answers, claims = _checked(wire)
        results, missing = _call("prepare", self._preparer.prepare, claims)
        for claim in claims:
            result = results.get(claim.uid) or PrepareResult(error=f"not prepared: {missing}")
            answers[claim.uid] = PrepareResult(
                tuple(map(_base_requests, result.devices)), result.error
            )
        _log_errors("prepare", claims, {uid: r.error for uid, r in answers.items()})
        return answers

    def unprepare(self, wire: Iterable[_WireClaim]) -> dict[str, str]:
        refused, claims = _checked(wire)
        errors = {uid: result.error for uid, result in refused.items()}
        results, missing = _call("unprepare", self._preparer.unprepare, claims)
        for claim in claims:
            error = results.get(claim.uid)
            errors[claim.uid] = f"not unprepared: {missing}" if error is None else error
        _log_errors("unprepare", claims, errors)
        return errors


def _call(
    verb: str, call: Callable[[Sequence[ClaimRef]], Mapping[str, _T]], claims: list[ClaimRef]
) -> tuple[Mapping[str, _T], str]:
    """The preparer's results, and what to say of a claim they leave out."""
    if not claims:
        return {}, ""
    try:
        return call(claims), "the driver gave no result for this claim"
    except Exception as err:
        log.exception("%s of %d claim(s) failed", verb, len(claims))
        return {}, f"{type(err).__name__}: {err}"


def _checked(wire: Iterable[_WireClaim]) -> tuple[dict[str, PrepareResult], list[ClaimRef]]:
    """Claims with every field set (once each), and an error for each of the others."""
    refused: dict[str, PrepareResult] = {}
    claims: dict[str, ClaimRef] = {}
    for message in wire:
        claim = ClaimRef(message.namespace, message.uid, message.name)
        empty = [field for field in ("uid", "namespace", "name") if not getattr(claim, field)]
        if empty:
            named = f"{claim.namespace or '?'}/{claim.name or '?'} ({claim.uid or 'no uid'})"
            refused[claim.uid] = PrepareResult(
                error=f"claim {named}: {', '.join(empty)} must not be empty"
            )
        else:
            claims.setdefault(claim.uid, claim)
    return refused, list(claims.values())


def _base_requests(device: PreparedDevice) -> PreparedDevice:
    """`req/sub` -> `req`: containers name base requests only (§3)."""
    names = tuple(dict.fromkeys(name.split("/", 1)[0] for name in device.request_names))
    return PreparedDevice(
        names, device.pool_name, device.device_name, device.cdi_device_ids, device.share_id
    )


def _log_errors(verb: str, claims: list[ClaimRef], errors: Mapping[str, str]) -> None:
    for uid, error in errors.items():
        if error:
            log.warning("%s of claim %s failed: %s", verb, uid or "(no uid)", error)
    log.debug("%s: %d claim(s), %d failed", verb, len(claims), sum(1 for e in errors.values() if e))


class _Version:
    """One version's DRAPlugin service over the shared ClaimService. The two versions'
    messages differ only in Device.share_id, so they are handled alike, loosely typed."""

    def __init__(self, claims: ClaimService, api: ModuleType, share_ids: bool) -> None:
        self._claims = claims
        self._api = api
        self._share_ids = share_ids

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self._api.NodePrepareResourcesResponse()
        for uid, result in self._claims.prepare(request.claims).items():
            entry = response.claims[uid]
            entry.error = result.error
            if not result.error:
                entry.devices.extend(self._device(d) for d in result.devices)
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self._api.NodeUnprepareResourcesResponse()
        for uid, error in self._claims.unprepare(request.claims).items():
            response.claims[uid].error = error
        return response

    def _device(self, device: PreparedDevice) -> Any:
        message = self._api.Device(
            request_names=device.request_names,
            pool_name=device.pool_name,
            device_name=device.device_name,
            cdi_device_ids=device.cdi_device_ids,
        )
        if self._share_ids and device.share_id is not None:
            message.share_id = device.share_id
        return message


class DraServer:
    def __init__(
        self, socket_path: Path, preparer: ClaimPreparer, health: HealthService | None = None
    ) -> None:
        """`health`: the health stream, served on the same socket (health.py)."""
        self._claims = ClaimService(preparer)
        self._health = health
        self._server = UnixServer(socket_path, "dra", WORKERS + MAX_STREAMS, MAX_CALLS)

    @property
    def socket_path(self) -> Path:
        return self._server.path

    def start(self) -> None:
        self._server.start(self._add_services)
        served = ", ".join(["v1.DRAPlugin", "v1beta1.DRAPlugin"] + [SERVICE] * bool(self._health))
        log.info("serving %s on %s", served, self.socket_path)

    def stop(self, grace: float = 1.0) -> None:
        self._server.stop(grace)

    def _add_services(self, server: grpc.Server) -> None:
        dra1_grpc.add_DRAPluginServicer_to_server(_Version(self._claims, dra1, True), server)
        dra1beta1_grpc.add_DRAPluginServicer_to_server(
            _Version(self._claims, dra1beta1, False), server
        )
        if self._health is not None:
            health_grpc.add_DRAResourceHealthServicer_to_server(self._health, server)
