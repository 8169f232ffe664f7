"""On a real kube-apiserver, kube-scheduler and kubelet: bursts, restarts of every part,
mode switches, GPU health, deletion, graceful termination and preemption.

The node has three mock GPUs of 16, 16 and 24 GiB (core_mem mode unless a test
switches it). Each test leaves no workload pod behind.
"""

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare import annotation
from gpushare.objects import Pod
from tests.e2e.checks import (
    admission_failures,
    assert_env_matches_annotation,
    assert_within_capacity,
    cluster_state,
)
from tests.e2e.kube import wait_for
from tests.e2e.local import GPU_SIZES, NODE, LocalCluster
from tests.e2e.workloads import WORKLOAD_LABEL, busybox_pod, gpu_job

pytestmark = [
    pytest.mark.realcluster,
    pytest.mark.timeout(600),
    pytest.mark.usefixtures("clean_workloads"),
]

FULL_MEM = sum(GPU_SIZES)


def gpus_of(local: LocalCluster, name: str) -> set[int]:
    raw = local.get("pod", name)
    allocation = annotation.decode(Pod.model_validate(raw))
    assert allocation is not None, f"{name} has no allocation"
    return {s.index for c in allocation.containers for s in c.gpus}


def failed_scheduling(local: LocalCluster, name: str) -> str | None:
    messages = [e["message"] for e in local.events_for(name) if e["reason"] == "FailedScheduling"]
    return messages[-1] if messages else None


def fits_somewhere(local: LocalCluster, raw: dict[str, Any]) -> bool:
    """Whether a single-GPU request would fit on some GPU of the node as it is now."""
    limits = raw["spec"]["containers"][0]["resources"]["limits"]
    mem = int(limits["aliyun.com/gpu-mem"])
    core = int(limits.get("aliyun.com/gpu-core.percentage", 0))
    state, _ = cluster_state(local)
    node = state.nodes[NODE]
    for gpu in node.inventory.gpus:
        used_mem, used_core, _ = node.used(gpu.index)
        if gpu.mem - used_mem >= mem and gpu.core - used_core >= core:
            return True
    return False


def test_a_burst_of_mixed_pods_is_placed_within_the_rules_and_none_is_stranded(
    local: LocalCluster,
):
    shapes = [(1, 5), (2, 10), (3, 15), (4, 20)]  # 28 pods ask 70 GiB and 350 percent
    burst = [busybox_pod(f"burst-{i:02d}", *shapes[i % len(shapes)]) for i in range(28)]
    started = time.monotonic()
    local.create(burst)

    def settled() -> list[dict[str, Any]] | None:
        pods = local.pods(WORKLOAD_LABEL)
        if len(pods) != len(burst):
            return None
        for raw in pods:
            phase = raw["status"].get("phase")
            if phase == "Running" or phase == "Failed":
                continue
            if raw["spec"].get("nodeName"):
                return None  # admitted, container starting
            if failed_scheduling(local, raw["metadata"]["name"]) is None:
                return None
            if fits_somewhere(local, raw):
                return None  # a pod that fits must not stay Pending
        return pods

    pods = wait_for("the burst to settle", settled, timeout=240, every=2)
    elapsed = time.monotonic() - started
    assert admission_failures(pods) == []
    running = [p for p in pods if p["status"]["phase"] == "Running"]
    assert len(running) >= 20, f"only {len(running)} of 28 placed in {elapsed:.0f}s"
    assert assert_env_matches_annotation(local, running) == len(running)
    state, _ = cluster_state(local)
    assert_within_capacity(state)
    assert local.extender is not None
    assert "Connection pool is full" not in local.extender.text()
    print(f"\nburst: {len(running)}/28 Running, the rest unplaceable, in {elapsed:.1f}s")


@pytest.mark.parametrize(
    ("fill", "waiting"),
    [((16, 16, 24), 16), ((10, 10, 18), 12)],
    ids=["node-full", "node-sum-fits-no-gpu-does"],
)
def test_a_waiting_pod_binds_within_seconds_of_a_gpu_freeing(
    local: LocalCluster, fill: tuple[int, ...], waiting: int
):
    """The scheduler retries a refused pod when an assigned pod is deleted, possibly
    before the extender's own watch has seen the deletion; the extender then nudges the
    pod (gpushare.io/requeued-at) once its cache frees the slice."""
    local.create([busybox_pod(f"fill-{i}", mem) for i, mem in enumerate(fill)])
    local.wait_running(WORKLOAD_LABEL, len(fill))
    freed = gpus_of(local, "fill-1")
    local.create([busybox_pod("waiter", waiting)])
    wait_for("waiter refused", lambda: failed_scheduling(local, "waiter"), 60, every=0.5)
    local.kubectl("delete", "pod", "fill-1", "--wait=true")
    gone = time.monotonic()
    wait_for("waiter bound", lambda: local.get("pod", "waiter")["spec"].get("nodeName"), 30, 0.2)
    delay = time.monotonic() - gone
    print(f"\nwaiter bound {delay:.1f}s after the freeing pod was gone")
    assert delay <= 5.0
    assert gpus_of(local, "waiter") == freed
    local.wait_running(WORKLOAD_LABEL, len(fill), timeout=60)


def scheduling_attempts(local: LocalCluster, name: str) -> int:
    return sum(
        e.get("count") or e.get("series", {}).get("count") or 1
        for e in local.events_for(name)
        if e["reason"] == "FailedScheduling"
    )


def test_the_scheduler_retries_a_pod_the_extender_refused_when_it_is_nudged(
    local: LocalCluster,
):
    """What the nudge relies on, on this version of kube-scheduler: a pod refused by the
    extender alone is retried at once when its annotations change."""
    local.create([busybox_pod("fill-0", 10), busybox_pod("fill-1", 10), busybox_pod("fill-2", 18)])
    local.wait_running(WORKLOAD_LABEL, 3)
    local.create([busybox_pod("waiter", 12)])  # the node has 18 GiB free, no GPU has 12
    wait_for("waiter refused", lambda: failed_scheduling(local, "waiter"), 60, every=0.5)
    time.sleep(2)  # past the scheduler's first backoff
    before = scheduling_attempts(local, "waiter")
    local.kubectl("annotate", "pod", "waiter", "gpushare.io/requeued-at=test", "--overwrite")
    wait_for(
        "another scheduling attempt",
        lambda: scheduling_attempts(local, "waiter") > before,
        timeout=10,
        every=0.2,
    )


def test_a_terminating_pod_keeps_its_gpu_until_it_is_gone(local: LocalCluster):
    local.create(
        [busybox_pod("trainer", 16, grace_s=25, ignore_sigterm=True), busybox_pod("other", 16)]
    )
    local.wait_running(WORKLOAD_LABEL, 2)
    held = gpus_of(local, "trainer")
    local.kubectl("delete", "pod", "trainer", "--wait=false")
    wait_for(
        "trainer to be terminating",
        lambda: local.get("pod", "trainer")["metadata"].get("deletionTimestamp"),
        30,
        every=0.2,
    )
    local.create([busybox_pod("successor", 16)])
    wait_for(
        "successor to be bound",
        lambda: local.get("pod", "successor")["spec"].get("nodeName"),
        60,
        every=0.5,
    )
    trainer = local.get("pod", "trainer")
    assert trainer["status"]["phase"] == "Running", "the trainer should still be checkpointing"
    assert gpus_of(local, "successor").isdisjoint(held), "placed beside a terminating pod"
    state, _ = cluster_state(local)
    assert_within_capacity(state)


@pytest.fixture
def priorities(local: LocalCluster) -> Iterator[None]:
    classes = [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": {"gpushare-e2e": "true"}},
            "value": value,
        }
        for name, value in (("e2e-low", 100), ("e2e-high", 1000))
    ]
    local.apply(classes)
    yield
    local.kubectl("delete", "priorityclass", "-l", WORKLOAD_LABEL, "--ignore-not-found")


def test_a_high_priority_pod_preempts_the_pods_that_free_one_gpu(
    local: LocalCluster, priorities: None
):
    """Seven 8 GiB pods fill 16 + 16 + 24 GiB; the scheduler's victims by node sum are
    two pods that may sit on different GPUs, which frees no GPU for 16 GiB."""
    low = [busybox_pod(f"low-{i}", 8, priority_class="e2e-low") for i in range(7)]
    local.create(low)
    local.wait_running(WORKLOAD_LABEL, 7)
    before = {p["metadata"]["name"]: gpus_of(local, p["metadata"]["name"]) for p in low}
    started = time.monotonic()
    local.create([busybox_pod("urgent", 16, priority_class="e2e-high")])

    wait_for("the high-priority pod to run", lambda: local.running("urgent"), 120, 1)
    elapsed = time.monotonic() - started
    remaining = {p["metadata"]["name"] for p in local.pods(WORKLOAD_LABEL)} - {"urgent"}
    victims = set(before) - remaining
    assert len(victims) == 2, f"evicted {sorted(victims)}"
    [gpu] = {index for name in victims for index in before[name]}  # both from one GPU
    assert gpus_of(local, "urgent") == {gpu}
    state, _ = cluster_state(local)
    assert_within_capacity(state)
    print(f"\npreemption: urgent Running {elapsed:.1f}s after creation, victims {victims}")


def test_an_unhealthy_gpu_leaves_allocatable_and_gets_no_new_pods(local: LocalCluster):
    local.health_file.write_text("1\n")
    try:
        wait_for(
            "GPU 1 out of allocatable",
            lambda: local.allocatable("aliyun.com/gpu-mem") == FULL_MEM - GPU_SIZES[1],
            timeout=60,
            every=1,
        )
        [gpu1] = [g for g in local.extender_view()["nodes"][0]["gpus"] if g["index"] == 1]
        assert gpu1["healthy"] is False
        local.create([busybox_pod("a", 16), busybox_pod("b", 16)])
        wait_for(
            "two pods bound",
            lambda: all(local.get("pod", n)["spec"].get("nodeName") for n in ("a", "b")),
            60,
            every=0.5,
        )
        assert gpus_of(local, "a") | gpus_of(local, "b") == {0, 2}
    finally:
        local.health_file.write_text("")
    wait_for(
        "GPU 1 back in allocatable",
        lambda: local.allocatable("aliyun.com/gpu-mem") == FULL_MEM,
        timeout=60,
        every=1,
    )


def set_mode(local: LocalCluster, mode: str) -> None:
    """Labels the node and waits until the kubelet advertises what the mode offers."""
    local.kubectl("label", "node", NODE, f"ack.node.gpu.schedule={mode}", "--overwrite")
    wanted = {300} if mode == "core_mem" else {0, None}
    wait_for(
        f"allocatable of a {mode} node",
        lambda: local.allocatable("aliyun.com/gpu-core.percentage") in wanted,
        timeout=60,
        every=1,
    )


def test_a_mode_switch_takes_effect_without_restarting_anything(local: LocalCluster):
    pids = {p.name: p.process.pid for p in (local.extender, local.plugin) if p and p.process}
    try:
        set_mode(local, "cgpu")
        local.create([busybox_pod("wants-compute", 2, 30), busybox_pod("memory-only", 2)])
        message = wait_for(
            "compute request refused", lambda: failed_scheduling(local, "wants-compute"), 60, 0.5
        )
        assert "gpu-core.percentage" in message, message
        running = wait_for("memory-only Running", lambda: local.running("memory-only"), 60, 0.5)
        assert assert_env_matches_annotation(local, [running]) == 1
        env = local.container_log(running, "app")
        assert "CGPU_DISABLE" not in env
        local.kubectl("delete", "pod", "memory-only", "wants-compute", "--wait=true")
        set_mode(local, "share")
        local.create([busybox_pod("shared", 2)])
        [shared] = local.wait_running(WORKLOAD_LABEL, 1, timeout=60)
        assert assert_env_matches_annotation(local, [shared]) == 1
        assert "CGPU_DISABLE=true" in local.container_log(shared, "app")
    finally:
        set_mode(local, "core_mem")
    now = {p.name: p.process.pid for p in (local.extender, local.plugin) if p and p.process}
    assert now == pids


def registrations(local: LocalCluster) -> list[datetime.datetime]:
    assert local.plugin is not None
    stamps = []
    for line in local.plugin.text().splitlines():
        if " registered aliyun.com/" in line:
            stamps.append(datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f"))
    return stamps


def test_after_a_kubelet_restart_the_plugin_re_registers_at_once_and_pods_run(
    local: LocalCluster,
):
    socket = local.state / "ns" / "var-lib" / "kubelet" / "device-plugins" / "kubelet.sock"
    before = len(registrations(local))
    local.restart_kubelet()
    stamps = wait_for(
        "three resources re-registered",
        lambda: registrations(local)[before:] if len(registrations(local)) >= before + 3 else None,
        timeout=30,
        every=0.2,
    )
    created = datetime.datetime.fromtimestamp(socket.stat().st_mtime)
    delay = (max(stamps[:3]) - created).total_seconds()
    print(f"\nre-registered {delay:.2f}s after kubelet.sock appeared")
    assert delay <= 1.0
    local.create([busybox_pod("after-restart", 2, 10)])
    [running] = local.wait_running(WORKLOAD_LABEL, 1, timeout=60)
    assert assert_env_matches_annotation(local, [running]) == 1


def test_a_device_plugin_restart_mid_burst_strands_no_pod_and_loses_no_slice(
    local: LocalCluster,
):
    """Pods the kubelet admits while no plugin is registered fail with the kubelet's
    UnexpectedAdmissionError (it rejects, it does not wait); their Job replaces them,
    and the failed ones hold no slice."""
    assert local.plugin is not None
    job = gpu_job("mid-burst", busybox_pod("mid", 2, 10), 10)
    local.create([job])
    time.sleep(1)
    local.plugin.stop()
    local.start_plugin()

    def settled() -> list[dict[str, Any]] | None:
        pods = local.pods(WORKLOAD_LABEL)
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        unsettled = [p for p in pods if p["status"].get("phase") not in ("Running", "Failed")]
        # A container answered by the stopped plugin just before it went is marked
        # assigned by the new one's reconciliation with PodResources, seconds later.
        assigned = all(_assigned(p) for p in running)
        return pods if len(running) == 10 and not unsettled and assigned else None

    pods = wait_for("ten Running pods of the job, each marked assigned", settled, timeout=180,
                    every=1)  # fmt: skip
    running = [p for p in pods if p["status"]["phase"] == "Running"]
    failed = admission_failures(pods)
    print(f"\nplugin restart mid-burst: {len(running)} Running, {len(failed)} rejected: {failed}")
    assert assert_env_matches_annotation(local, running) == len(running)
    assert all("UnexpectedAdmissionError" in f for f in failed), failed
    state, _ = cluster_state(local)
    assert_within_capacity(state)
    charged = set(state.nodes[NODE].pods)
    assert charged == {f"default/{p['metadata']['name']}" for p in running}
    local.kubectl("delete", "job", "mid-burst", "--wait=true")


def _assigned(raw: dict[str, Any]) -> bool:
    allocation = annotation.decode(Pod.model_validate(raw))
    return allocation is not None and all(c.assigned for c in allocation.containers)


def comparable(view: dict[str, Any]) -> dict[str, Any]:
    for node in view["nodes"]:
        for gpu in node["gpus"]:
            for held in gpu["pods"]:
                held.pop("assumed", None)
    return view


def test_a_restarted_extender_rebuilds_the_same_state_from_annotations(local: LocalCluster):
    assert local.extender is not None
    local.create([busybox_pod(f"kept-{i}", 3, 20) for i in range(5)])
    local.wait_running(WORKLOAD_LABEL, 5)
    before = comparable(local.extender_view())
    local.extender.stop()
    local.start_extender()
    after = wait_for(
        "the extender synced", lambda: (v := local.extender_view())["synced"] and v, 30, 0.5
    )
    assert comparable(after) == before
    local.create([busybox_pod("kept-new", 3, 20)])
    local.wait_running(WORKLOAD_LABEL, 6, timeout=60)
    state, _ = cluster_state(local)
    assert_within_capacity(state)
