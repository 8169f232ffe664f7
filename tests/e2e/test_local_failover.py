"""On a real cluster: restarts and failover never strand a pod.

Two kube-scheduler processes share one Lease, each with its own extender, as the
chart's two scheduler replicas do; the leader dies mid-burst and the standby
finishes the burst. The kubelet is restarted ten times in a row, each time a new GPU
pod runs within seconds. Sidecar containers (Kubernetes >= 1.29) hold their own slice.
"""

import datetime
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpushare import annotation
from gpushare.objects import Pod
from tests.e2e.checks import assert_env_matches_annotation, assert_within_capacity, cluster_state
from tests.e2e.kube import wait_for
from tests.e2e.local import SCHEDULER_CONFIG, HostProcess, LocalCluster, webhooks_on_loopback
from tests.e2e.workloads import BUSYBOX, WORKLOAD_LABEL, busybox_pod, runnable

pytestmark = [
    pytest.mark.realcluster,
    pytest.mark.timeout(600),
    pytest.mark.usefixtures("clean_workloads"),
]

STANDBY_EXTENDER_PORT = 39998
STANDBY_OPS_PORT = 39995
STANDBY_WEBHOOK_PORT = 9444
STANDBY_SCHEDULER_PORT = 10261
LEASE = "gpushare-scheduler"
ACQUIRED = re.compile(r"^I(\d{4} \d\d:\d\d:\d\d\.\d+).*successfully acquired lease")


def acquired_at(log: str) -> datetime.datetime | None:
    """When a kube-scheduler's log says it became leader (klog time, this year)."""
    for line in log.splitlines():
        match = ACQUIRED.match(line)
        if match:
            stamp = datetime.datetime.strptime(match.group(1), "%m%d %H:%M:%S.%f")
            return stamp.replace(year=datetime.datetime.now().year)
    return None


@pytest.fixture
def standby(local: LocalCluster) -> Iterator[tuple[HostProcess, HostProcess]]:
    """A second extender and kube-scheduler beside the harness's own, waiting on the
    Lease. Afterwards the harness's pair is the leader again."""
    assert local.extender is not None and local.bins is not None
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    config["extenders"][0]["urlPrefix"] = (
        f"http://127.0.0.1:{STANDBY_EXTENDER_PORT}/gpushare-scheduler"
    )
    config["clientConnection"] = {"kubeconfig": str(local.kubeconfig)}
    config_file = local.our_dir / "standby-scheduler.yaml"
    config_file.write_text(yaml.safe_dump(config))
    extender = HostProcess(
        "standby extender",
        [
            str(local.venv_bin / "gpushare-extender"), "--host", "127.0.0.1",
            "--port", str(STANDBY_EXTENDER_PORT), "--ops-port", str(STANDBY_OPS_PORT),
            "--webhook-port", str(STANDBY_WEBHOOK_PORT),
            "--tls-cert-file", str(local.our_dir / "webhook.crt"),
            "--tls-key-file", str(local.our_dir / "webhook.key"),
            "--kubeconfig", str(local.our_dir / "scheduler.kubeconfig"),
        ],
        local.logs / "gpushare-extender-standby.log",
    ).start()  # fmt: skip
    scheduler = HostProcess(
        "standby scheduler",
        [
            str(local.bins.directory / "kube-scheduler"), f"--config={config_file}",
            "--bind-address=127.0.0.1", f"--secure-port={STANDBY_SCHEDULER_PORT}", "--v=2",
        ],
        local.logs / "scheduler-standby.log",
    ).start()  # fmt: skip
    wait_for(
        "the standby to wait for the lease",
        lambda: "attempting to acquire leader lease" in scheduler.since_start(),
        timeout=30,
        every=0.5,
    )
    try:
        yield extender, scheduler
    finally:
        restore_harness_leader(local, extender, scheduler)


def restore_harness_leader(
    local: LocalCluster, extender: HostProcess, scheduler: HostProcess
) -> None:
    if local.extender is not None and not local.extender.alive:
        local.start_extender()
    if not local.scheduler_alive():
        local.start_scheduler()
    local.apply(webhooks_on_loopback(local.rendered, local.ca_pem))
    scheduler.stop()
    extender.stop()
    wait_for(
        "the harness's scheduler to lead again",
        lambda: acquired_at(local.scheduler_log()),
        timeout=60,
        every=0.5,
    )


def create_one_by_one(local: LocalCluster, pods: list[dict[str, Any]]) -> None:
    """As a client does: each pod created in turn, a refused call tried again."""
    for pod_ in pods:
        wait_for(
            f"{pod_['metadata']['name']} created",
            lambda p=pod_: local.create([p], check=False).returncode == 0,
            timeout=20,
            every=0.5,
        )


def test_the_standby_scheduler_finishes_a_burst_when_the_leader_dies(
    local: LocalCluster, standby: tuple[HostProcess, HostProcess]
):
    extender, scheduler = standby
    assert local.extender is not None
    burst = [busybox_pod(f"failover-{i:02d}", 2, 10) for i in range(16)]
    creator = threading.Thread(target=create_one_by_one, args=(local, burst))
    creator.start()
    wait_for("the burst under way", lambda: len(local.pods(WORKLOAD_LABEL)) >= 4, 30, 0.1)
    # The leader's pod dies: its kube-scheduler and its extender. The webhook Service
    # routes to both replicas; here the configurations name the standby from now on.
    local.apply(webhooks_on_loopback(local.rendered, local.ca_pem, STANDBY_WEBHOOK_PORT))
    local.kill_scheduler()
    local.extender.stop(signal.SIGKILL)
    killed = datetime.datetime.now()
    started = time.monotonic()
    creator.join()
    assert len(local.pods(WORKLOAD_LABEL)) == len(burst)
    unbound = [p for p in local.pods(WORKLOAD_LABEL) if not p["spec"].get("nodeName")]
    assert unbound, "every pod was bound before the kill: nothing failed over"
    pods = local.wait_running(WORKLOAD_LABEL, len(burst), timeout=30)
    all_running = time.monotonic() - started
    leader_at = acquired_at(scheduler.since_start())
    assert leader_at is not None, "the standby never took the lease"
    takeover = (leader_at - killed).total_seconds()
    print(f"\nfailover: standby leader {takeover:.1f}s after the kill, "
          f"all {len(burst)} pods Running {all_running:.1f}s after it")  # fmt: skip
    assert assert_env_matches_annotation(local, pods) == len(pods)
    state, _ = cluster_state(local)
    assert_within_capacity(state)
    assert "Connection pool is full" not in extender.text()


def test_ten_kubelet_restarts_in_a_row_strand_no_pod(local: LocalCluster):
    """A pod created as soon as the kubelet is back may wait for the kubelet's next node
    status (every 10 s) to show our resources again; it must never wait longer."""
    for attempt in range(10):
        local.restart_kubelet()
        name = f"restart-{attempt}"
        started = time.monotonic()
        local.create([busybox_pod(name, 1, 5)])
        running = wait_for(f"{name} Running", lambda n=name: local.running(n), 20, 0.2)
        print(f"\nkubelet restart {attempt + 1}: pod Running {time.monotonic() - started:.1f}s")
        assert assert_env_matches_annotation(local, [running]) == 1
        local.kubectl("delete", "pod", name, "--wait=true")


def sidecar_pod() -> dict[str, Any]:
    """An app with a sidecar (an init container that keeps running) and a plain init
    container, each asking its own slice."""
    doc = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "with-sidecar"},
        "spec": {
            "schedulerName": "gpushare-scheduler",
            "restartPolicy": "Never",
            "initContainers": [
                {"name": "setup", "resources": {"limits": {"aliyun.com/gpu-mem": 3}}},
                {"name": "logger", "restartPolicy": "Always",
                 "resources": {"limits": {"aliyun.com/gpu-mem": 2}}},
            ],
            "containers": [{"name": "app", "resources": {"limits": {"aliyun.com/gpu-mem": 4}}}],
        },
    }  # fmt: skip
    pod = runnable(doc, BUSYBOX, "IfNotPresent")
    [_, logger] = pod["spec"]["initContainers"]
    logger["command"] = pod["spec"]["containers"][0]["command"]
    return pod


def test_a_sidecar_holds_its_own_slice_for_the_pods_life(local: LocalCluster):
    if local.bins is not None and local.bins.minor < 29:
        pytest.skip(f"sidecar containers are on by default from Kubernetes 1.29; {local.version}")
    local.create([sidecar_pod()])
    [running] = local.wait_running(WORKLOAD_LABEL, 1, timeout=60)
    allocation = annotation.decode(Pod.model_validate(running))
    assert allocation is not None
    assert {c.name for c in allocation.containers} == {"setup", "logger", "app"}
    assert assert_env_matches_annotation(local, [running]) == 3
    statuses = {s["name"]: s for s in running["status"]["initContainerStatuses"]}
    assert "running" in statuses["logger"]["state"], statuses["logger"]
    state, _ = cluster_state(local)
    assert_within_capacity(state)
    [node] = state.nodes.values()
    held = sum(node.used(g.index)[0] for g in node.inventory.gpus)
    assert held == 6, "the running pod holds its sidecar's 2 GiB and its app's 4 GiB"
