"""What an operator does with the chart and what they must see, on any cluster where it
is installed with Helm: the local cluster in bridge mode (tests/e2e/bridge.py), kind
(tests/e2e/kind.py) or any cluster a KUBECONFIG names.

Each scenario takes an `Installed`: the cluster reached with kubectl, the Helm
release, and the one thing that differs between ways of getting a cluster, how a
container is killed. Figures a scenario measures are returned for the test to print.
"""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare.inventory import NODE_GPUS_ANNOTATION
from gpushare.manifests import pods_from_manifests
from gpushare.objects import Pod
from gpushare.request import parse_pod_request
from tests.e2e.checks import (
    admission_failures,
    assert_env_matches_annotation,
    assert_placed_as_asked,
    assert_within_capacity,
    cluster_state,
)
from tests.e2e.helm import HelmRelease
from tests.e2e.kube import KubectlTarget, wait_for
from tests.e2e.workloads import WORKLOAD_LABEL, gpu_job, gpu_pod, manifests

PART_OF = "app.kubernetes.io/part-of=gpushare"
SCHEDULER_LEASE = "gpushare-scheduler"


@dataclass
class Installed:
    target: KubectlTarget
    release: HelmRelease
    values: dict[str, Any]
    """The values the release was installed with."""
    nodes: list[str]
    """The GPU-sharing nodes (labelled, advertising GPUs)."""
    image: str
    """Image for workload pods: it must have `sh`, `env` and `sleep`."""
    pull_policy: str
    kill_containers: Callable[[dict[str, Any]], list[str]]
    """SIGKILLs every container of a pod (no graceful exit, nothing released)."""
    installed_at: float = 0.0
    """time.monotonic() when `helm install` started."""
    own_image: str = ""
    """gpushare's image as its pods name it, where the values leave it to the chart's
    default; "" when the values' image.repository and image.tag name it."""

    @property
    def namespace(self) -> str:
        return self.release.namespace

    def component_pods(self, component: str) -> list[dict[str, Any]]:
        selector = (
            f"app.kubernetes.io/instance={self.release.name},"
            f"app.kubernetes.io/component={component}"
        )
        pods = self.target.pods(selector, self.namespace)
        return [p for p in pods if "deletionTimestamp" not in p["metadata"]]

    def ready_component(self, component: str, count: int, timeout: float = 180) -> list[Any]:
        """The component's `count` pods once each runs with every container ready."""

        def ready() -> list[dict[str, Any]] | None:
            pods = self.component_pods(component)
            ok = [
                p
                for p in pods
                if p["status"].get("phase") == "Running"
                and all(c.get("ready") for c in p["status"].get("containerStatuses", []))
            ]
            return ok if len(ok) == count == len(pods) else None

        return wait_for(f"{count} ready {component} pod(s)", ready, timeout=timeout, every=0.5)

    def lease(self) -> dict[str, Any]:
        return self.target.get("lease", "-n", self.namespace, SCHEDULER_LEASE)

    def leader_pod(self) -> dict[str, Any]:
        """The scheduler pod holding the Lease (kube-scheduler's identity is
        <hostname>_<uuid>, and a pod's hostname is its name)."""
        holder = self.lease()["spec"].get("holderIdentity") or ""
        pods = {p["metadata"]["name"]: p for p in self.component_pods("scheduler")}
        name = holder.split("_", 1)[0]
        assert name in pods, f"the Lease is held by {holder!r}, not one of {sorted(pods)}"
        return pods[name]

    def gpu_pod(self, name: str, mem: int, core: int | None = None) -> dict[str, Any]:
        return gpu_pod(name, mem, core, image=self.image, pull_policy=self.pull_policy)

    def allocatable(self, node: str, resource: str) -> str | None:
        return self.target.get("node", node)["status"].get("allocatable", {}).get(resource)


# ----- install


def components_run_and_gpus_are_advertised(
    installed: Installed, gpu_mem: int, gpu_count: int
) -> None:
    """One node pod per GPU node, every scheduler replica ready, one of them leading,
    and each node's GPUs in its allocatable and its inventory annotation."""
    installed.ready_component("node", len(installed.nodes))
    replicas = installed.values.get("scheduler", {}).get("replicas", 2)
    installed.ready_component("scheduler", replicas)
    installed.leader_pod()
    for node in installed.nodes:
        assert installed.allocatable(node, "aliyun.com/gpu-mem") == str(gpu_mem)
        assert installed.allocatable(node, "aliyun.com/gpu-count") == str(gpu_count)
        annotations = installed.target.get("node", node)["metadata"]["annotations"]
        assert NODE_GPUS_ANNOTATION in annotations


def first_gpu_pod_runs(installed: Installed) -> float:
    """Seconds from `helm install` to a GPU pod Running with its environment."""
    installed.target.create([installed.gpu_pod("first-gpu-pod", 1)])
    [pod] = installed.target.wait_running(WORKLOAD_LABEL, 1, timeout=120)
    took = time.monotonic() - installed.installed_at
    assert assert_env_matches_annotation(installed.target, [pod]) == 1
    return took


def example_runs_with_env_matching_annotation(installed: Installed, path: Path) -> None:
    documents = manifests(path, installed.image, installed.pull_policy)
    expected = len(pods_from_manifests(documents))
    installed.target.apply(documents)
    pods = installed.target.wait_running(WORKLOAD_LABEL, expected, timeout=180)
    for raw in pods:
        assert_placed_as_asked(Pod.model_validate(raw))
    wanted = sum(len(parse_pod_request(Pod.model_validate(p)).containers) for p in pods)
    assert assert_env_matches_annotation(installed.target, pods) == wanted
    state, _ = cluster_state(installed.target)
    assert_within_capacity(state)


def invalid_example_is_refused_naming_the_rule(installed: Installed, path: Path) -> str:
    documents = manifests(path, installed.image, installed.pull_policy)
    refused = installed.target.apply(documents, check=False)
    assert refused.returncode != 0, refused.stdout
    assert "denied the request" in refused.stderr, refused.stderr
    assert "[core-multiple-of-5]" in refused.stderr, refused.stderr
    for doc in documents:
        missing = installed.target.kubectl("get", "pod", doc["metadata"]["name"], check=False)
        assert "NotFound" in missing.stderr
    return refused.stderr


# ----- failover


def _bound_within(installed: Installed, name: str, limit: float, since: float) -> float:
    """Seconds from `since` until pod `name` has a node; fails past `limit`."""

    def bound() -> bool:
        return bool(installed.target.get("pod", name)["spec"].get("nodeName"))

    wait_for(f"{name} to be bound", bound, timeout=limit + 30, every=0.2)
    took = time.monotonic() - since
    assert took <= limit, f"{name} bound {took:.1f}s after the leader went, limit {limit:.0f}s"
    return took


@dataclass(frozen=True)
class Failover:
    bound_after_s: float
    old_holder: str
    new_holder: str
    webhook_failures_s: list[float]
    """When creating the pod failed because the webhook's endpoint was the dead one."""


def leader_failover(installed: Installed, how: str) -> Failover:
    """The leading scheduler pod dies (`how`: "delete" the pod, or "kill" its containers);
    a GPU pod created at once is bound within the Lease's duration + 5 s."""
    leader = installed.leader_pod()
    lease = installed.lease()
    old_holder = lease["spec"]["holderIdentity"]
    limit = int(lease["spec"]["leaseDurationSeconds"]) + 5
    name = leader["metadata"]["name"]
    started = time.monotonic()
    if how == "delete":
        installed.target.kubectl("delete", "pod", "-n", installed.namespace, name, "--wait=false")
    else:
        assert installed.kill_containers(leader) == [
            c["name"] for c in leader["status"]["containerStatuses"]
        ]
    waiting = installed.gpu_pod(f"after-leader-{how}", 1)
    refused = create_retrying_webhook_failures(installed, waiting, within=limit)
    took = _bound_within(installed, waiting["metadata"]["name"], limit, started)
    new_holder = installed.lease()["spec"]["holderIdentity"]
    assert new_holder != old_holder
    [running] = installed.target.wait_running(WORKLOAD_LABEL, 1, timeout=60)
    assert assert_env_matches_annotation(installed.target, [running]) == 1
    replicas = installed.values.get("scheduler", {}).get("replicas", 2)
    installed.ready_component("scheduler", replicas)
    return Failover(took, old_holder, new_holder, refused)


def create_retrying_webhook_failures(
    installed: Installed, pod: dict[str, Any], within: float
) -> list[float]:
    """Creates the pod as a controller would: again after a webhook call that failed
    (kube-apiserver may still send it to the endpoint of a container that just died,
    and does not retry a refused connection). Returns when each failure came, in
    seconds from the first try; fails if creation did not succeed `within` seconds."""
    started = time.monotonic()
    failures: list[float] = []
    while True:
        result = installed.target.create([pod], check=False)
        if result.returncode == 0:
            return failures
        assert "failed calling webhook" in result.stderr, result.stderr
        failures.append(time.monotonic() - started)
        assert failures[-1] < within, f"the webhook failed for {within:.0f}s: {result.stderr}"
        time.sleep(0.2)


# ----- the device plugin's pod


def plugin_pod_deleted_mid_admission(installed: Installed, node: str) -> tuple[int, int]:
    """A Job's pods are being admitted on `node` (one that isolates compute) when its
    node pod is deleted: the DaemonSet brings it back, it registers again, every pod of
    the Job runs with its slice, and pods the kubelet rejected meanwhile hold none.
    Returns (running, rejected)."""
    [node_pod] = [p for p in installed.component_pods("node") if p["spec"]["nodeName"] == node]
    gpu_mem = installed.allocatable(node, "aliyun.com/gpu-mem")
    job = gpu_job(
        "mid-admission",
        installed.gpu_pod("mid", 2, 10),
        10,
        nodeSelector={"kubernetes.io/hostname": node},
    )
    installed.target.create([job])
    time.sleep(1)
    installed.target.kubectl(
        "delete", "pod", "-n", installed.namespace, node_pod["metadata"]["name"], "--wait=false"
    )

    def settled() -> list[dict[str, Any]] | None:
        pods = installed.target.pods(WORKLOAD_LABEL)
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        unsettled = [p for p in pods if p["status"].get("phase") not in ("Running", "Failed")]
        return pods if len(running) == 10 and not unsettled else None

    pods = wait_for("the Job's ten pods Running", settled, timeout=240, every=1)
    back = installed.ready_component("node", len(installed.nodes))
    [again] = [p for p in back if p["spec"]["nodeName"] == node]
    assert again["metadata"]["uid"] != node_pod["metadata"]["uid"]
    wait_for(
        "the node to advertise its GPUs again",
        lambda: installed.allocatable(node, "aliyun.com/gpu-mem") == gpu_mem,
        timeout=60,
        every=0.5,
    )
    running = [p for p in pods if p["status"]["phase"] == "Running"]
    failed = admission_failures(pods)
    assert all("UnexpectedAdmissionError" in f for f in failed), failed
    assert assert_env_matches_annotation(installed.target, running) == len(running)
    state, _ = cluster_state(installed.target)
    assert_within_capacity(state)
    charged = {key for key in state.nodes[node].pods if key.startswith("default/")}
    assert charged == {f"default/{p['metadata']['name']}" for p in running}
    return len(running), len(failed)


# ----- upgrade


def _roll(values: dict[str, Any], revision: str) -> dict[str, Any]:
    """The values with a pod annotation that changes: every pod of ours is replaced."""
    rolled = {key: dict(value) if isinstance(value, dict) else value
              for key, value in values.items()}  # fmt: skip
    for component in ("node", "scheduler"):
        section = dict(rolled.get(component, {}))
        section["podAnnotations"] = {"gpushare-e2e/revision": revision}
        rolled[component] = section
    return rolled


def _webhook_ca_bundles(installed: Installed) -> list[str]:
    kinds = "validatingwebhookconfigurations,mutatingwebhookconfigurations"
    configs = installed.target.get(kinds, "-l", PART_OF)["items"]
    bundles = [h["clientConfig"]["caBundle"] for c in configs for h in c["webhooks"]]
    assert bundles, "no webhook configuration of ours"
    return bundles


def upgrade_keeps_every_allocation(installed: Installed, previous_chart: Path) -> float:
    """GPU pods started under the previous commit's chart keep their slices through
    `helm upgrade` to this chart, which replaces every pod of ours; afterwards a new
    pod is placed beside them, not on top. Returns the upgrade's seconds."""
    installed.release.upgrade(_roll(installed.values, "previous"), chart=previous_chart)
    installed.ready_component("node", len(installed.nodes))
    pods = [installed.gpu_pod(f"keep-{i}", mem, core)
            for i, (mem, core) in enumerate([(8, 30), (4, 20), (12, 50)])]  # fmt: skip
    installed.target.create(pods)
    before = {p["metadata"]["name"]: p for p in installed.target.wait_running(WORKLOAD_LABEL, 3)}
    old_ours = {p["metadata"]["uid"] for c in ("node", "scheduler")
                for p in installed.component_pods(c)}  # fmt: skip
    revision = installed.release.revision()
    ca_bundles = _webhook_ca_bundles(installed)
    started = time.monotonic()
    installed.release.upgrade(_roll(installed.values, "current"))
    took = time.monotonic() - started
    assert installed.release.revision() == revision + 1
    # The chart `lookup`s its webhook Secret: an upgrade keeps the certificate.
    assert _webhook_ca_bundles(installed) == ca_bundles
    replicas = installed.values.get("scheduler", {}).get("replicas", 2)
    new_ours = {
        p["metadata"]["uid"]
        for p in installed.ready_component("node", len(installed.nodes))
        + installed.ready_component("scheduler", replicas)
    }
    assert not new_ours & old_ours, "the upgrade was to replace every pod of ours"
    after = {p["metadata"]["name"]: p for p in installed.target.pods(WORKLOAD_LABEL)}
    assert set(after) == set(before)
    for name, pod in after.items():
        assert pod["metadata"]["uid"] == before[name]["metadata"]["uid"]
        assert pod["status"]["phase"] == "Running"
        assert pod["metadata"]["annotations"] == before[name]["metadata"]["annotations"], name
        assert [c["restartCount"] for c in pod["status"]["containerStatuses"]] == [0]
    installed.target.create([installed.gpu_pod("after-upgrade", 10, 40)])
    running = installed.target.wait_running(WORKLOAD_LABEL, 4, timeout=120)
    assert assert_env_matches_annotation(installed.target, running) == 4
    state, _ = cluster_state(installed.target)
    assert_within_capacity(state)
    return took


# ----- uninstall


def uninstall_leaves_nothing_of_ours(installed: Installed) -> list[str]:
    """After `helm uninstall`: none of the release's objects, no webhook configuration,
    ClusterRole or binding, Lease, hook object or node annotation of ours; a pod that
    asks for no GPU is still scheduled and runs. Returns what was checked."""
    objects = installed.release.manifest()
    installed.release.uninstall()
    checked = []
    for obj in objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        where = ["-n", obj["metadata"].get("namespace") or installed.namespace]
        gone = installed.target.kubectl("get", kind, name, *where, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr, f"{kind}/{name} is left"
        checked.append(f"{kind}/{name}")
    for kinds in (
        "validatingwebhookconfigurations,mutatingwebhookconfigurations",
        "clusterroles,clusterrolebindings",
    ):
        left = installed.target.get(kinds, "-l", PART_OF)["items"]
        assert left == [], [o["metadata"]["name"] for o in left]
    left = installed.target.get(
        "all,leases,secrets,configmaps,serviceaccounts,roles,rolebindings",
        "-n", installed.namespace,
    )["items"]  # fmt: skip
    ours = [
        f"{o['kind']}/{o['metadata']['name']}"
        for o in left
        if o["kind"] != "ConfigMap" or o["metadata"]["name"] != "kube-root-ca.crt"
        if o["kind"] != "ServiceAccount" or o["metadata"]["name"] != "default"
    ]
    assert ours == [], f"left in {installed.namespace}: {ours}"
    for node in installed.nodes:
        annotations = installed.target.get("node", node)["metadata"].get("annotations", {})
        assert NODE_GPUS_ANNOTATION not in annotations, node
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "no-gpu-after-uninstall", "labels": {"gpushare-e2e": "true"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "app", "image": installed.image,
                 "imagePullPolicy": installed.pull_policy,
                 "command": ["sh", "-c", "sleep 3600"]}
            ],
        },
    }  # fmt: skip
    installed.target.create([plain])
    installed.target.wait_running(WORKLOAD_LABEL, 1, timeout=60)
    return checked


# ----- who reaches the scheduler verbs

_PROBE = """
import json, sys, urllib.error, urllib.request
outcomes = {}
for name, url in json.loads(sys.argv[1]).items():
    body = b'{"PodName":"probe","PodNamespace":"default","Node":"x","NodeNames":["x"]}'
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"},
        method="POST" if "/gpushare-scheduler/" in url else "GET",
    )
    try:
        outcomes[name] = str(urllib.request.urlopen(request, timeout=5).status)
    except urllib.error.HTTPError as err:
        outcomes[name] = str(err.code)
    except Exception as err:
        outcomes[name] = type(getattr(err, "reason", err)).__name__
print(json.dumps(outcomes))
"""


def scheduler_verbs_refused_to_ordinary_pods(installed: Installed) -> dict[str, str]:
    """From an ordinary pod, /bind and /filter at the extender's pod IP and Service are
    refused or unreachable, while the operational port answers the same pod (so the
    pod network works) and kube-scheduler still places a GPU pod. Returns what the
    probe got per target: an HTTP status or the connection error's name."""
    leader = installed.leader_pod()
    pod_ip = leader["status"]["podIP"]
    selector = (
        f"app.kubernetes.io/instance={installed.release.name},app.kubernetes.io/component=scheduler"
    )
    [service] = installed.target.get("service", "-n", installed.namespace, "-l", selector)["items"]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    verb_port = installed.values.get("extender", {}).get("port", 39999)
    cluster_ip = service["spec"]["clusterIP"]
    targets = {"ops at the pod IP": f"http://{pod_ip}:{ports['http']}/healthz"}
    for verb in ("bind", "filter"):
        for where, address in (("pod IP", pod_ip), ("Service", cluster_ip)):
            for port in {verb_port, ports["http"]}:
                url = f"http://{address}:{port}/gpushare-scheduler/{verb}"
                targets[f"{verb} at the {where}:{port}"] = url
    image = installed.values.get("image", {})
    own_image = installed.own_image or f"{image['repository']}:{image['tag']}"
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "verb-probe",
            "namespace": "default",
            "labels": dict([WORKLOAD_LABEL.split("=")]),
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "probe",
                    "image": own_image,
                    "imagePullPolicy": image.get("pullPolicy", "IfNotPresent"),
                    "command": ["python3", "-c", _PROBE, json.dumps(targets)],
                }
            ],
        },
    }
    installed.target.create([probe])

    def finished() -> dict[str, Any] | None:
        pod = installed.target.get("pod", "verb-probe")
        return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

    done = wait_for("the probe pod to finish", finished, timeout=180, every=1)
    log = installed.target.container_log(done, "probe")
    assert done["status"]["phase"] == "Succeeded", log
    outcomes: dict[str, str] = json.loads(log.strip().splitlines()[-1])
    assert outcomes.pop("ops at the pod IP") == "200", outcomes  # the pod network works
    served = {target: got for target, got in outcomes.items() if got.startswith("2")}
    assert served == {}, f"scheduler verbs answered an ordinary pod: {outcomes}"
    placed = installed.gpu_pod("placed-after-probe", 1)
    placed["metadata"]["labels"]["gpushare-e2e-placed"] = "true"
    installed.target.create([placed])
    pods = installed.target.wait_running(WORKLOAD_LABEL + ",gpushare-e2e-placed=true", 1)
    assert assert_env_matches_annotation(installed.target, pods) == 1
    return outcomes
