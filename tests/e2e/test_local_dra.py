"""On a real kube-apiserver, kube-scheduler, kube-controller-manager, kubelet and
containerd: gpushare in DRA mode (docs/dra.md), from Kubernetes 1.34.

What only a real cluster shows: the kubelet accepts the driver's registration and
calls its DRA service; the API server stores the slice's sharing fields (with
DRAConsumableCapacity) or drops them without a word (without it); kube-scheduler
allocates the claim the webhook's template makes, and the container gets what the
driver prepared through CDI; the kubelet unprepares when the pod goes, and deletes a
gone driver's slice. The node has three mock GPUs of 16, 16 and 24 GiB in core_mem
mode; each pod scenario leaves no workload pod or claim behind.
"""

import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from gpushare.dra.ackresources import ACK_RESOURCES
from gpushare.dra.claims import DRIVER, POD_CLAIM
from gpushare.inventory import NODE_GPUS_ANNOTATION, decode_gpus
from tests.e2e.checks import assert_env_matches_annotation, env_of
from tests.e2e.kube import wait_for
from tests.e2e.local import GPU_SIZES, NODE
from tests.e2e.localdra import GATE, REGISTERED, LocalDraCluster, gate_off_args
from tests.e2e.workloads import BUSYBOX, WORKLOAD_LABEL, busybox_pod, runnable

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(600)]

T = TypeVar("T")

SHARES = "20"
"""Claims one GPU takes (the 20-pods-per-GPU rule), docs/dra.md#the-slice."""
REQUEST = "app"
"""The container of workloads.gpu_pod, hence the name of its request in the claim."""


# ----- helpers


def explained(
    cluster: LocalDraCluster, what: str, probe: Callable[[], T | None], timeout: float, *pods: str
) -> T:
    """wait_for, failing with what the cluster and our parts say about `pods`."""
    try:
        return wait_for(what, probe, timeout=timeout, every=1)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{cluster.diagnosis(*pods)}") from None


def ack_pod(name: str, mem: int) -> dict[str, Any]:
    """An ACK pod as its users write it: `aliyun.com/gpu-mem: <mem>`, no scheduler named
    (the webhook names ours, whose kube-scheduler allocates the claim)."""
    pod = busybox_pod(name, mem)
    del pod["spec"]["schedulerName"]
    return pod


def the_slice(cluster: LocalDraCluster) -> dict[str, Any]:
    found = explained(cluster, f"the ResourceSlice of node {NODE}", cluster.node_slices, 60)
    assert len(found) == 1, f"one slice per node, found {[s['metadata']['name'] for s in found]}"
    return found[0]


def devices_of(slice_: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in slice_["spec"]["devices"]}


def shared(slice_: dict[str, Any]) -> bool:
    return all(d.get("allowMultipleAllocations") is True for d in slice_["spec"]["devices"])


def running(cluster: LocalDraCluster, name: str, timeout: float = 180) -> dict[str, Any]:
    return explained(cluster, f"pod {name} Running", lambda: cluster.running(name), timeout, name)


def claim_of(cluster: LocalDraCluster, pod: dict[str, Any]) -> dict[str, Any]:
    """The claim kube-controller-manager made for the pod from the webhook's template."""
    statuses = pod["status"].get("resourceClaimStatuses", [])
    names = [s["resourceClaimName"] for s in statuses if s["name"] == POD_CLAIM]
    assert len(names) == 1, f"pod {pod['metadata']['name']} claim statuses: {statuses}"
    claim: dict[str, Any] = cluster.get("resourceclaim", names[0])
    return claim


def only_result(claim: dict[str, Any]) -> dict[str, Any]:
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1, f"claim {claim['metadata']['name']}: {results}"
    result: dict[str, Any] = results[0]
    return result


def spec_file(claim: dict[str, Any], request: str = REQUEST) -> str:
    """The CDI spec the driver writes for a claim's request
    (docs/dra.md#prepare-what-a-container-gets)."""
    return f"{DRIVER}-{claim['metadata']['uid']}-{request}.json"


def printed_env(cluster: LocalDraCluster, pod: dict[str, Any]) -> dict[str, str]:
    """The environment the pod's container printed when it started."""
    log = explained(
        cluster,
        f"pod {pod['metadata']['name']} to print its environment",
        lambda: cluster.container_log(pod, REQUEST) or None,
        30,
        pod["metadata"]["name"],
    )
    return env_of(log)


def size_of(device: dict[str, Any]) -> int:
    value: str = device["capacity"]["memory"]["value"]
    assert value.endswith("Gi"), value
    return int(value.removesuffix("Gi"))


@pytest.fixture
def needs_cdi(dra_cluster: LocalDraCluster) -> None:
    if dra_cluster.cdi_missing:
        pytest.skip(dra_cluster.cdi_missing)


@pytest.fixture
def clean(dra_cluster: LocalDraCluster) -> Iterator[None]:
    """Afterwards no workload pod or claim is left. Pods are deleted gracefully: the
    kubelet unprepares their claims before they are gone, so the next scenario starts
    from a node whose driver holds nothing."""
    yield
    dra_cluster.kubectl(
        "delete", "pods", "-l", WORKLOAD_LABEL, "--grace-period=2", "--wait=true",
        "--timeout=150s", "--ignore-not-found", timeout=180,
    )  # fmt: skip
    dra_cluster.kubectl(
        "delete", "resourceclaims", "-l", WORKLOAD_LABEL, "--wait=true", "--timeout=60s",
        "--ignore-not-found", timeout=90,
    )  # fmt: skip


# ----- 1. registration and the slice


def test_the_driver_registers_and_publishes_one_shareable_device_per_gpu(
    dra_cluster: LocalDraCluster,
) -> None:
    cluster = dra_cluster
    assert cluster.driver is not None
    assert REGISTERED in cluster.driver.since_start(), cluster.driver.tail()
    published = the_slice(cluster)
    spec = published["spec"]
    node = cluster.get("node", NODE)
    assert spec["pool"]["name"] == NODE
    assert spec["pool"]["resourceSliceCount"] == 1
    owners = [
        (o["kind"], o["name"], o["uid"]) for o in published["metadata"].get("ownerReferences", [])
    ]
    assert owners == [("Node", NODE, node["metadata"]["uid"])], "the slice goes with its Node"
    devices = devices_of(published)
    assert sorted(devices) == [f"gpu-{i}" for i in range(len(GPU_SIZES))]
    for index, size in enumerate(GPU_SIZES):
        device = devices[f"gpu-{index}"]
        where = f"device gpu-{index} as stored"
        assert device.get("allowMultipleAllocations") is True, (
            f"{where}: the API server dropped the sharing (is {GATE} on in kube-apiserver? "
            f"its extra flags: {cluster.apiserver_args!r})\n{json.dumps(device, indent=1)}"
        )
        assert device["attributes"]["index"] == {"int": index}, where
        assert device["attributes"]["mode"] == {"string": "core_mem"}, where
        capacity = device["capacity"]
        assert capacity["memory"] == {
            "value": f"{size}Gi",
            "requestPolicy": {"default": f"{size}Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
        }, where
        assert capacity["shares"]["value"] == SHARES, where
        assert capacity["shares"]["requestPolicy"]["validValues"] == ["1", SHARES], where
        assert capacity["cores"]["value"] == "100", f"{where}: a core_mem node isolates compute"
    # `kubectl inspect cgpu` reads the node's GPU annotation: the driver wrote it under
    # the chart's RBAC and own-node policy, with the slice's GPUs.
    written = explained(
        cluster, "the driver to annotate its node with its GPUs",
        lambda: cluster.get("node", NODE)["metadata"].get("annotations", {}).get(
            NODE_GPUS_ANNOTATION
        ),
        30,
    )  # fmt: skip
    annotated = decode_gpus(written)
    assert len(annotated) == len(GPU_SIZES), annotated
    assert [g.uuid for g in annotated] == [
        devices[f"gpu-{g.index}"]["attributes"]["uuid"]["string"] for g in annotated
    ]


def test_the_kubelet_deletes_a_stopped_drivers_slice_and_the_driver_back_publishes_it(
    dra_cluster: LocalDraCluster,
) -> None:
    """A stopped driver leaves its slice; the kubelet deletes it some 30 s after the
    driver deregistered (DRA-INTERFACES §3; what docs/dra.md#migrating-a-node relies on),
    and the driver publishes it again when it is back."""
    cluster = dra_cluster
    assert cluster.driver is not None
    the_slice(cluster)
    cluster.driver.stop()  # SIGTERM: it removes its registration socket
    stopped = time.monotonic()
    try:
        assert cluster.node_slices(), "the driver itself must not withdraw its slice on stop"
        explained(
            cluster, "the kubelet to delete the slice of the gone driver",
            lambda: not cluster.node_slices(), 120,
        )  # fmt: skip
        waited = time.monotonic() - stopped
        assert "withdrew" not in cluster.driver.since_start()
        assert waited > 10, f"the slice went {waited:.0f}s after the stop, not the kubelet's 30s"
    finally:
        cluster.start_driver()
    back = explained(cluster, "the driver to publish its slice again", cluster.node_slices, 60)
    assert len(back) == 1 and shared(back[0]) and len(back[0]["spec"]["devices"]) == len(GPU_SIZES)


# ----- 2. an ACK pod through the webhook, prepared by the driver, unprepared at deletion


@pytest.mark.usefixtures("needs_cdi", "clean")
def test_an_ack_pod_runs_with_the_claim_the_webhook_gave_it(dra_cluster: LocalDraCluster) -> None:
    cluster = dra_cluster
    cluster.create([ack_pod("dra-ack", 4)])
    pod = running(cluster, "dra-ack")

    # The webhook's rewrite, as the API server stored it.
    [pod_claim] = pod["spec"]["resourceClaims"]
    assert pod_claim["name"] == POD_CLAIM
    assert pod_claim["resourceClaimTemplateName"].startswith("gpushare-"), pod_claim
    [container] = pod["spec"]["containers"]
    limits = container["resources"].get("limits", {})
    assert not [k for k in limits if k.startswith("aliyun.com/")], limits
    assert container["resources"]["claims"] == [{"name": POD_CLAIM, "request": REQUEST}]
    assert pod["spec"]["schedulerName"] == "gpushare-scheduler"
    assert json.loads(pod["metadata"]["annotations"][ACK_RESOURCES]) == {
        REQUEST: {"aliyun.com/gpu-mem": "4"}
    }

    # kube-scheduler allocated 4 GiB of one of our GPUs, shared, for this pod.
    claim = claim_of(cluster, pod)
    result = only_result(claim)
    assert (result["driver"], result["pool"]) == (DRIVER, NODE), result
    assert result["consumedCapacity"]["memory"] == "4Gi", result
    assert result.get("shareID"), f"a shared GPU's result has a shareID: {result}"
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]

    # The container got, through the CDI spec the driver wrote, what the device plugin
    # gives: the environment its allocation record implies, on the allocated GPU.
    device = devices_of(the_slice(cluster))[result["device"]]
    env = printed_env(cluster, pod)
    assert env.get("ALIYUN_COM_GPU_MEM_CONTAINER") == "4", (
        f"the container lacks the driver's environment (did containerd apply the CDI "
        f"device?): {sorted(env)}\n{cluster.diagnosis('dra-ack')}"
    )
    assert env["ALIYUN_COM_GPU_MEM_IDX"] == str(device["attributes"]["index"]["int"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == device["attributes"]["uuid"]["string"]
    # The extender's books hold it where the allocator put it (its charge, then the
    # driver's record): what its node scores for the next pod read.
    [node] = [n for n in cluster.extender_view()["nodes"] if n["name"] == NODE]
    [gpu] = [g for g in node["gpus"] if g["index"] == device["attributes"]["index"]["int"]]
    assert {p["pod"]: p["memGiB"] for p in gpu["pods"]} == {"default/dra-ack": 4}, node
    assert assert_env_matches_annotation(cluster, [cluster.get("pod", "dra-ack")]) == 1
    prepared = spec_file(claim)
    assert prepared in cluster.cdi_files(), cluster.cdi_files()

    # Deleting the pod unprepares its claim: the CDI spec goes.
    cluster.kubectl(
        "delete", "pod", "dra-ack", "--grace-period=2", "--wait=true", "--timeout=150s",
        timeout=180,
    )  # fmt: skip
    explained(
        cluster, f"the driver to remove {prepared} (NodeUnprepareResources)",
        lambda: prepared not in cluster.cdi_files(), 90,
    )  # fmt: skip
    assert f"unprepared claim default/{claim['metadata']['name']}" in cluster.driver_log()


# ----- 3. the driver killed after a prepare


def over_committing_pod(
    cluster: LocalDraCluster, name: str, device: str, memory_gib: int
) -> dict[str, Any]:
    """A pod bound to the node with a claim allocated by hand on `device`, `memory_gib`
    of it: the scheduler's view and the node's disagree (another allocator, a slice
    republished under it). kube-scheduler never makes such a claim itself, so it is
    written here, as an admin may, and the pod is bound without it."""
    labels = dict([WORKLOAD_LABEL.split("=")])
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": labels},
        "spec": {"devices": {"requests": [{"name": REQUEST, "exactly": {
            "deviceClassName": DRIVER,
            "capacity": {"requests": {"memory": f"{memory_gib}Gi"}},
        }}]}},
    }  # fmt: skip
    pod = runnable(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": NODE,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": POD_CLAIM, "resourceClaimName": name}],
                "containers": [{"name": REQUEST, "resources": {
                    "claims": [{"name": POD_CLAIM, "request": REQUEST}]}}],
            },
        },
        BUSYBOX,
        "IfNotPresent",
    )  # fmt: skip
    cluster.create([claim, pod])
    uid = cluster.get("pod", name)["metadata"]["uid"]
    status = {"status": {
        "allocation": {
            "devices": {"results": [{
                "request": REQUEST, "driver": DRIVER, "pool": NODE, "device": device,
                "shareID": str(uuid.uuid4()),
                "consumedCapacity": {"memory": f"{memory_gib}Gi", "cores": "0", "shares": "1"},
            }]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
        },
        "reservedFor": [{"resource": "pods", "name": name, "uid": uid}],
    }}  # fmt: skip
    cluster.kubectl(
        "patch", "resourceclaim", name, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    # The kubelet tried the pod before its claim was reserved for it and retries at its
    # next sync of the pod (a minute away): an update of the pod makes that now.
    cluster.kubectl("annotate", "pod", name, "gpushare-e2e/claim-allocated=true")
    claim_now: dict[str, Any] = cluster.get("resourceclaim", name)
    return claim_now


@pytest.mark.usefixtures("needs_cdi", "clean")
def test_a_driver_killed_after_a_prepare_keeps_the_claim_and_gives_its_capacity_to_no_other(
    dra_cluster: LocalDraCluster,
) -> None:
    cluster = dra_cluster
    assert cluster.driver is not None
    cluster.create([ack_pod("dra-before", 4)])
    before = running(cluster, "dra-before")
    held = claim_of(cluster, before)
    device = only_result(held)["device"]
    size = size_of(devices_of(the_slice(cluster))[device])
    [status] = before["status"]["containerStatuses"]
    assert spec_file(held) in cluster.cdi_files()

    cluster.driver.stop(signal.SIGKILL)  # a crash: nothing cleaned up, nothing withdrawn
    cluster.start_driver()  # the kubelet registers it again

    # The pod runs on, untouched, and its prepared claim with it.
    after = cluster.get("pod", "dra-before")
    [status_after] = after["status"]["containerStatuses"]
    assert after["status"]["phase"] == "Running"
    assert (status_after["containerID"], status_after["restartCount"]) == (
        status["containerID"],
        0,
    )
    assert spec_file(held) in cluster.cdi_files(), "the restart must keep prepared claims' specs"

    # The restarted driver prepares new claims, on capacity the first one does not hold.
    cluster.create([ack_pod("dra-after", 16)])
    later = running(cluster, "dra-after")
    later_result = only_result(claim_of(cluster, later))
    assert later_result["device"] != device, f"16 GiB do not fit beside 4 on {device}"
    assert printed_env(cluster, later).get("ALIYUN_COM_GPU_MEM_CONTAINER") == "16"

    # A claim that would take what the first one holds is refused by the node.
    over = over_committing_pod(cluster, "dra-overcommit", device, size)

    def refusal() -> str | None:
        for event in cluster.events_for("dra-overcommit"):
            if event["reason"] == "FailedPrepareDynamicResources" and (
                "would over-commit" in event["message"]
            ):
                return str(event["message"])
        return None

    message = explained(
        cluster, "the kubelet to report the driver's refusal of the over-committing claim",
        refusal, 150, "dra-overcommit",
    )  # fmt: skip
    assert f"4 of {size} GiB held, {size} GiB asked" in message, message
    assert cluster.get("pod", "dra-overcommit")["status"].get("phase") != "Running"
    assert spec_file(over) not in cluster.cdi_files()
    assert cluster.running("dra-before") is not None


# ----- 4. without the gate (last: it restarts kube-apiserver twice)


def test_without_the_gate_the_api_server_drops_sharing_and_the_driver_says_so(
    dra_cluster: LocalDraCluster,
) -> None:
    """docs/dra.md#what-each-release-needs: an API server without DRAConsumableCapacity
    drops the slice's sharing fields without an error; the driver reads back what was
    stored, names the gate in its log and publishes whole GPUs."""
    cluster = dra_cluster
    assert cluster.driver is not None
    with_gate = cluster.apiserver_args
    cluster.driver.stop()
    try:
        cluster.delete_node_slices()
        cluster.restart_apiserver(gate_off_args(cluster.minor))
        cluster.start_driver()
        explained(
            cluster, f"the driver to report the sharing dropped, naming {GATE}",
            lambda: "dropped the sharing" in cluster.driver_log(), 60,
        )  # fmt: skip
        assert GATE in cluster.driver_log()
        whole = explained(
            cluster, "the slice of whole GPUs",
            lambda: [s for s in cluster.node_slices() if "requestPolicy" not in json.dumps(s)],
            60,
        )  # fmt: skip
        devices = devices_of(whole[0])
        assert sorted(devices) == [f"gpu-{i}" for i in range(len(GPU_SIZES))]
        for index, size in enumerate(GPU_SIZES):
            device = devices[f"gpu-{index}"]
            assert not device.get("allowMultipleAllocations"), device
            assert device["capacity"]["memory"] == {"value": f"{size}Gi"}, device
    finally:
        cluster.driver.stop()
        cluster.delete_node_slices()
        cluster.restart_apiserver(with_gate)
        cluster.start_driver()
    back = explained(
        cluster, "the shared slice again, with the gate back",
        lambda: [s for s in cluster.node_slices() if shared(s)], 60,
    )  # fmt: skip
    assert len(back) == 1
