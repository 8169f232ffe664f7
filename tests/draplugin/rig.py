"""A node under test for DRA mode: the kubelet stand-in and our registration and DRA
servers with a scripted preparer, over real unix sockets in a temp dir."""

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpushare.draplugin.registration import RegistrationServer
from gpushare.draplugin.server import ClaimRef, DraServer, PrepareResult, dra_socket
from gpushare.standins.drakubelet import ClaimView, DraKubeletStandIn, PodClaim

DRIVER = "gpu.gpushare.io"
NODE = "node-a"
WAIT = 5.0
"""Generous bound for anything that should take milliseconds."""


def eventually(condition: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@dataclass
class ScriptedPreparer:
    """A ClaimPreparer that answers what the test put in `results` / `errors`, and
    records every call."""

    results: dict[str, PrepareResult] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    raises: Exception | None = None
    prepared: list[list[ClaimRef]] = field(default_factory=list)
    unprepared: list[list[ClaimRef]] = field(default_factory=list)

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        self.prepared.append(list(claims))
        if self.raises is not None:
            raise self.raises
        return {c.uid: self.results[c.uid] for c in claims if c.uid in self.results}

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        self.unprepared.append(list(claims))
        if self.raises is not None:
            raise self.raises
        return {c.uid: self.errors.get(c.uid, "") for c in claims}


class DraNode:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.root = workdir / "kubelet"
        self.registry = self.root / "plugins_registry"
        self.cdi_dir = workdir / "cdi"
        self.cdi_dir.mkdir()
        self.claims: dict[tuple[str, str], ClaimView] = {}
        self.wiped: list[tuple[str, str | None]] = []
        self.preparer = ScriptedPreparer()
        self.dra = DraServer(dra_socket(self.root / "plugins", DRIVER), self.preparer)
        self.registration = RegistrationServer(self.registry, DRIVER, self.dra.socket_path)
        self.kubelet: DraKubeletStandIn | None = None

    def start_driver(self) -> "DraNode":
        self.dra.start()
        self.registration.start()
        return self

    def start_kubelet(self, **kwargs: object) -> DraKubeletStandIn:
        kwargs.setdefault("poll_interval", 0.02)
        self.kubelet = DraKubeletStandIn(
            self.root,
            NODE,
            lambda namespace, name: self.claims.get((namespace, name)),
            self.cdi_dir,
            wipe_slices=lambda node, driver: self.wiped.append((node, driver)),
            **kwargs,  # type: ignore[arg-type]
        )
        self.kubelet.start()
        return self.kubelet

    def started(self, **kwargs: object) -> DraKubeletStandIn:
        """Driver and kubelet up, the driver registered."""
        self.start_driver()
        kubelet = self.start_kubelet(**kwargs)
        assert kubelet.wait_for(lambda: DRIVER in kubelet.registered(), WAIT)
        return kubelet

    def claim(self, name: str, pods: Sequence[str], drivers: Sequence[str] = (DRIVER,)) -> PodClaim:
        """An allocated claim reserved for `pods`."""
        claim = PodClaim("default", f"uid-{name}", name)
        self.claims[("default", name)] = ClaimView(claim.uid, True, tuple(drivers), tuple(pods))
        return claim

    def stop(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
        self.registration.stop()
        self.dra.stop(grace=0)
