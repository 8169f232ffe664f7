"""Per-GPU gauges, as the chart's dashboard reads them."""

from gpushare.resources import GPU_MEM
from tests.deviceplugin.rig import eventually


def test_per_gpu_gauges_follow_the_pods_placed_on_each_gpu(make_rig):
    rig = make_rig(layout="2x16GiB:T4", mode="core_mem").start()
    rig.bind("a", [[0]], mem=2, core=30)
    rig.bind("b", [[0]], mem=4, core=20)
    whole = rig.bind("whole", [[1]], count=1)
    rig.kubelet.admit(whole)
    metrics = rig.plugin.metrics

    def gauge(name: str, gpu: int) -> float | None:
        return metrics.value(name, gpu=str(gpu))

    assert metrics.value("gpushare_gpu_memory_total_gib", gpu="0", model="T4") == 16
    assert [gauge("gpushare_gpu_memory_allocated_gib", g) for g in (0, 1)] == [6, 16]
    assert [gauge("gpushare_gpu_core_allocated_percent", g) for g in (0, 1)] == [50, 100]
    assert [gauge("gpushare_gpu_pods", g) for g in (0, 1)] == [2, 1]
    assert [gauge("gpushare_gpu_healthy", g) for g in (0, 1)] == [1, 1]
    assert (
        metrics.value(
            "gpushare_device_plugin_allocate_total", resource="aliyun.com/gpu-count", result="ok"
        )
        == 1
    )
    assert (
        metrics.value(
            "gpushare_device_plugin_match_latency_seconds_count", resource="aliyun.com/gpu-count"
        )
        == 1
    )
    assert metrics.value("gpushare_device_plugin_registrations_total", resource=GPU_MEM) == 1


def container_series(rig, pod: str) -> dict[str, dict[str, float]]:
    """The plugin's per-container series of `pod`, by metric, then `container GPU<n>`."""
    found: dict[str, dict[str, float]] = {}
    for family in rig.plugin.metrics.registry.collect():
        for sample in family.samples:
            if sample.name.startswith("gpushare_container_") and sample.labels["pod"] == pod:
                assert sample.labels["namespace"] == "default"
                where = f"{sample.labels['container']} GPU{sample.labels['gpu']}"
                found.setdefault(sample.name, {})[where] = sample.value
    return found


def test_an_assigned_container_is_exported_before_its_first_gpu_process_until_its_pod_goes(
    make_rig,
):
    """No process of these pods ever touches a GPU (the agent, which learns of containers
    from NVML's process list, has nothing of them): the plugin's series show each
    container's GPU, memory and share from the bind, and whether the kubelet admitted it."""
    rig = make_rig(layout="2x16GiB:T4", mode="core_mem").start()
    rig.bind("waiting", [[0]], mem=2, core=30)
    idle = rig.bind("idle", [[1]], mem=4, core=20)
    rig.kubelet.admit(idle)
    rig.wait_assigned("idle")

    assert eventually(lambda: container_series(rig, "idle").get("gpushare_container_assigned"))
    assert eventually(
        lambda: container_series(rig, "idle")["gpushare_container_assigned"] == {"main GPU1": 1}
    )
    assert container_series(rig, "idle") == {
        "gpushare_container_memory_allocated_bytes": {"main GPU1": 4 << 30},
        "gpushare_container_core_allocated_percent": {"main GPU1": 20},
        "gpushare_container_assigned": {"main GPU1": 1},
    }
    assert container_series(rig, "waiting") == {
        "gpushare_container_memory_allocated_bytes": {"main GPU0": 2 << 30},
        "gpushare_container_core_allocated_percent": {"main GPU0": 30},
        "gpushare_container_assigned": {"main GPU0": 0},
    }

    rig.cluster.delete_pod("default", "idle")

    assert eventually(lambda: container_series(rig, "idle") == {})
    assert container_series(rig, "waiting")["gpushare_container_assigned"] == {"main GPU0": 0}


def test_a_pod_that_finished_loses_its_container_series(make_rig):
    rig = make_rig(layout="1x16GiB", mode="cgpu").start()
    done = rig.bind("done", [[0]], mem=2)
    rig.kubelet.admit(done)
    assert eventually(lambda: container_series(rig, "done") != {})

    rig.cluster.set_pod_phase("default", "done", "Succeeded")

    assert eventually(lambda: container_series(rig, "done") == {})
