"""The real DRA driver on a node under test: gpushare-dra-plugin wired as `main` wires
it (mock GPUs, the in-memory API server), the kubelet stand-in over real unix sockets,
and claims made the way the webhook, the claim controller and the scheduler make them."""

import uuid
from dataclasses import dataclass
from pathlib import Path

from gpushare.cluster.memory import MemoryCluster
from gpushare.dra.claims import DeviceResult
from gpushare.dra.objects import (
    AllocationResult,
    DeviceAllocationResult,
    DeviceRequestAllocationResult,
    ResourceClaim,
    ResourceClaimConsumerReference,
    ResourceClaimStatus,
)
from gpushare.draplugin.main import Driver, build, build_parser
from gpushare.gpunode.backends.mock import MockBackend
from gpushare.gpunode.interposer import LIBRARY_NAME, PRELOAD_NAME
from gpushare.labels import LABEL_SCHEDULE
from gpushare.objects import Node, Pod
from gpushare.objects import ObjectMeta as PodMeta
from gpushare.standins.claimcontroller import admit_ack_pod
from gpushare.standins.drakubelet import DraKubeletStandIn, PodClaim, claim_lookup
from tests.draplugin.rig import eventually

NODE = "dra-node"
DRIVER = "gpu.gpushare.io"


@dataclass(frozen=True)
class Placed:
    pod: Pod
    claim: ResourceClaim

    @property
    def pod_claim(self) -> PodClaim:
        meta = self.claim.metadata
        return PodClaim(meta.namespace or "", meta.uid or "", meta.name)


class DriverRig:
    def __init__(
        self,
        workdir: Path,
        mode: str = "cgpu",
        layout: str = "2x16GiB",
        sharing: bool = True,
        interposer: bool = True,
        store: MemoryCluster | None = None,
        resource_health: bool = False,
    ) -> None:
        """`resource_health`: the kubelet watches the driver's health stream (1.36)."""
        self.workdir = workdir
        self.store = store or MemoryCluster()
        self.kubelet_root = workdir / "kubelet"
        self.cdi_dir = workdir / "cdi"
        self.state_dir = workdir / "state"
        self.interposer_dir = workdir / "interposer"
        self.interposer_dir.mkdir(parents=True, exist_ok=True)
        if interposer:  # what the isolation agent installs at its start
            (self.interposer_dir / LIBRARY_NAME).write_bytes(b"\x7fELF")
            (self.interposer_dir / PRELOAD_NAME).write_text(str(self.interposer_dir / LIBRARY_NAME))
        self.store.add_node(
            Node(metadata=PodMeta(name=NODE, labels={LABEL_SCHEDULE: mode} if mode else {}))
        )
        self.args = build_parser().parse_args(
            [
                f"--node-name={NODE}",
                "--backend=mock",
                f"--mock-gpus={layout}",
                f"--kubelet-root={self.kubelet_root}",
                f"--cdi-dir={self.cdi_dir}",
                f"--state-dir={self.state_dir}",
                f"--interposer-dir={self.interposer_dir}",
                f"--sharing={'on' if sharing else 'off'}",
                f"--mock-health-file={workdir / 'unhealthy'}",
            ]
        )
        self.backend = MockBackend.from_layout(layout, NODE, workdir / "unhealthy", 0.05)
        self.driver: Driver | None = None
        self.kubelet = DraKubeletStandIn(
            self.kubelet_root,
            NODE,
            claim_lookup(self.store),
            self.cdi_dir,
            wipe_slices=lambda node, driver: self.store.delete_resource_slices(node, driver),
            poll_interval=0.02,
            resource_health=resource_health,
            health_retry_s=0.1,
        )

    def start(self) -> "DriverRig":
        self.start_driver()
        self.kubelet.start()
        assert self.kubelet.wait_for(lambda: DRIVER in self.kubelet.registered(), 5.0)
        # The kubelet wiped the node's slices as it started: the driver publishes again.
        assert eventually(lambda: bool(self.slices()))
        return self

    def start_driver(self) -> Driver:
        self.driver = build(self.args, self.store, self.store, self.backend)
        self.driver.publisher._resync_s = 0.05
        self.driver.start()
        assert eventually(lambda: bool(self.slices()))
        return self.driver

    def restart_driver(self) -> None:
        """Stops the driver and starts it again, and waits until the kubelet has
        registered the new one."""
        before = len(self.kubelet.registrations)
        self.stop_driver()
        self.start_driver()
        assert self.kubelet.wait_for(lambda: len(self.kubelet.registrations) > before, 5.0)

    def stop_driver(self) -> None:
        if self.driver is not None:
            self.driver.stop()
            self.driver = None

    def stop(self) -> None:
        self.kubelet.stop()
        self.stop_driver()

    def slices(self):
        return self.store.list_resource_slices(DRIVER, NODE)

    # ----- claims, as the webhook, the claim controller and the scheduler make them

    def place(self, pod: Pod, results: list[DeviceResult]) -> Placed:
        """The ACK pod as DRA mode runs it: rewritten by the webhook (its JSONPatch
        applied as the API server does), its claim made from the template by the claim
        controller, allocated to `results` and reserved for the pod by the scheduler."""
        admitted = admit_ack_pod(self.store, pod)
        assert admitted is not None, "only a pod that asks a GPU gets a claim"
        pod, claim = admitted.pod, admitted.claim
        status = ResourceClaimStatus(
            allocation=AllocationResult(
                devices=DeviceAllocationResult(
                    results=[
                        DeviceRequestAllocationResult(
                            request=r.request,
                            driver=DRIVER,
                            pool=NODE,
                            device=r.device,
                            share_id=r.share_id,
                            consumed_capacity=_consumed(r),
                        )
                        for r in results
                    ]
                ),
                node_selector={
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODE]}
                            ]
                        }
                    ]
                },
            ),
            reserved_for=[
                ResourceClaimConsumerReference(
                    resource="pods", name=pod.metadata.name, uid=pod.metadata.uid
                )
            ],
        )
        claim = self.store.update_resource_claim_status(claim.model_copy(update={"status": status}))
        return Placed(pod, claim)


def shared(request: str, device: str, mem_gib: int, cores: int = 0) -> DeviceResult:
    return DeviceResult(request, device, str(uuid.uuid4()), mem_gib * 1024**3, cores, 1)


def whole(request: str, device: str) -> DeviceResult:
    return DeviceResult(request, device, None, None, None, None)


def _consumed(result: DeviceResult) -> dict[str, str]:
    if result.share_id is None:
        return {}
    consumed = {"memory": f"{(result.memory_bytes or 0) // 1024**3}Gi", "shares": "1"}
    if result.cores is not None:
        consumed["cores"] = str(result.cores)
    return consumed
