"""Per-GPU gauges, as the chart's dashboard reads them."""

from gpushare.resources import GPU_MEM


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
