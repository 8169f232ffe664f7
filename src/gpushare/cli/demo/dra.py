"""The demo's DRA stage: the example pods on a node in DRA mode (docs/dra.md).

Each pod goes the way a cluster on Kubernetes 1.34+ takes it: the mutating webhook
rewrites its `aliyun.com/*` request to one resource claim, the claim controller makes
the claim from the template, kube-scheduler's allocator (a stand-in) picks the devices
from the slice the real `gpushare-dra-plugin` published, and the kubelet stand-in has
the driver prepare the claim over the real DRA gRPC socket; each container's
environment is what its CDI device carries.
"""

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpushare.cli.demo.admission import SHOWN_PREFIXES
from gpushare.cluster.memory import MemoryCluster
from gpushare.dra.allocator import Unfit
from gpushare.dra.claims import DRIVER, device_class
from gpushare.draplugin.main import Driver, build, build_parser
from gpushare.errors import PodRefused
from gpushare.gpunode.backends.mock import MockBackend
from gpushare.labels import LABEL_SCHEDULE
from gpushare.objects import Node, Pod
from gpushare.objects import ObjectMeta as NodeMeta
from gpushare.standins.claimcontroller import admit_ack_pod
from gpushare.standins.draallocation import DraAllocationStandIn
from gpushare.standins.drakubelet import DraKubeletStandIn, PodClaim, claim_lookup

NODE: Final = "gpu-node-dra"
MODE: Final = "core_mem"
LAYOUT: Final = "2x16GiB:Tesla-T4"
READY_TIMEOUT: Final = 10.0


@dataclass(frozen=True, slots=True)
class Outcome:
    pod: str
    line: str
    env: dict[str, dict[str, str]]
    """Container → its environment, for the pods prepared."""


def run_stage(pods: list[Pod]) -> str:
    store = MemoryCluster()
    store.add_node(Node(metadata=NodeMeta(name=NODE, labels={LABEL_SCHEDULE: MODE})))
    store.create_device_class(device_class())
    with tempfile.TemporaryDirectory(prefix="gd-", dir="/tmp") as tmp:
        work = Path(tmp)
        args = build_parser().parse_args(
            [
                f"--node-name={NODE}",
                "--backend=mock",
                f"--mock-gpus={LAYOUT}",
                f"--kubelet-root={work / 'k'}",
                f"--cdi-dir={work / 'cdi'}",
                f"--state-dir={work / 'state'}",
                "--interposer-dir=",
                f"--mock-health-file={work / 'unhealthy'}",
            ]
        )
        driver = build(args, store, store, MockBackend.from_layout(LAYOUT, NODE))
        kubelet = DraKubeletStandIn(work / "k", NODE, claim_lookup(store), work / "cdi")
        driver.start()
        kubelet.start()
        try:
            _ready(driver, kubelet, store)
            outcomes = [_run(store, kubelet, pod) for pod in pods]
        finally:
            kubelet.stop()
            driver.stop()
    return _render(store, outcomes)


def _ready(driver: Driver, kubelet: DraKubeletStandIn, store: MemoryCluster) -> None:
    if not kubelet.wait_for(lambda: DRIVER in kubelet.registered(), READY_TIMEOUT):
        raise RuntimeError("the DRA driver did not register with the kubelet stand-in")
    driver.publisher.wake()  # the kubelet wiped the node's slices as it started
    if not driver.publisher.published.wait(READY_TIMEOUT):
        raise RuntimeError("the DRA driver did not publish its ResourceSlice")
    for _ in range(int(READY_TIMEOUT * 20)):
        if store.list_resource_slices(DRIVER, NODE):
            return
        driver.publisher.wake()
        kubelet.wait_for(lambda: False, 0.05)
    raise RuntimeError("the DRA driver's ResourceSlice did not appear")


def _run(store: MemoryCluster, kubelet: DraKubeletStandIn, pod: Pod) -> Outcome:
    key = f"{pod.metadata.namespace or 'default'}/{pod.metadata.name}"
    try:
        admitted = admit_ack_pod(store, pod, claim_suffix="")
    except PodRefused as refused:
        return Outcome(key, f"refused by the webhook: {refused}", {})
    if admitted is None:
        return Outcome(key, "asks for no GPU", {})
    created, claim, request = admitted.pod, admitted.claim, admitted.request
    namespace, claim_name = claim.metadata.namespace or "default", claim.metadata.name
    allocated = DraAllocationStandIn(store).allocate(namespace, claim_name, NODE, created)
    if isinstance(allocated, Unfit):
        return Outcome(created.key, f"Pending: {allocated}", {})
    ref = PodClaim(namespace, claim.metadata.uid or "", claim_name)
    kubelet.prepare(created.metadata.uid, [ref])
    results = store.get_resource_claim(namespace, claim_name).results_for(DRIVER)
    env = {
        c.name: kubelet.container_edits(created.metadata.uid, ref.uid, c.name).env
        for c in request.containers
    }
    devices = ", ".join(f"{r.request} on {r.device}" for r in results)
    return Outcome(created.key, f"claim {claim_name} allocated: {devices}", env)


def _render(store: MemoryCluster, outcomes: list[Outcome]) -> str:
    (published,) = store.list_resource_slices(DRIVER, NODE)
    capacities = ", ".join(sorted(published.spec.devices[0].capacity))
    lines = [
        f"DRA mode on {NODE} (ack.node.gpu.schedule={MODE}, GPUs {LAYOUT}): gpushare-dra-plugin "
        f"published {len(published.spec.devices)} shareable GPU(s) ({capacities}); the webhook "
        "rewrote each pod to one claim, the allocator stand-in chose the devices, the kubelet "
        "stand-in had the driver prepare them (real gRPC on unix sockets, CDI):"
    ]
    for outcome in outcomes:
        lines.append(f"  {outcome.pod}: {outcome.line}")
        for container, env in outcome.env.items():
            lines.append(f"    container {container}:")
            lines += [f"      {k}={env[k]}" for k in sorted(env) if k.startswith(SHOWN_PREFIXES)]
    return "\n".join(lines)
