"""A GPU added to or taken out of a running node: the plugin lists the GPUs again and
re-advertises them through the open ListAndWatch streams and the node's GPU annotation,
without a restart. A GPU that goes while pods hold it stays in the books, Unhealthy."""

import logging
from dataclasses import replace

import pynvml
import pytest

from gpushare.deviceplugin.rediscovery import reconcile
from gpushare.gpunode.backends.nvml import NvmlBackend
from gpushare.gpunode.backends.port import PhysicalGpu
from gpushare.inventory import NODE_GPUS_ANNOTATION, Gpu, decode_gpus, parse_layout
from gpushare.resources import GPU_COUNT, GPU_MEM
from tests.deviceplugin.rig import Rig, eventually
from tests.fakenvml import T4_BYTES, FakeGpu, World, fake_driver

REDISCOVER = 0.05


def physical(layout: str, node: str = "n1") -> tuple[PhysicalGpu, ...]:
    return tuple(PhysicalGpu(g, g.index) for g in parse_layout(layout, node))


def published(rig: Rig) -> list[tuple[int, int, bool]]:
    """(index, GiB, healthy) of each GPU in the node's gpushare.io/gpus annotation."""
    value = rig.cluster.get_node(rig.node).metadata.annotations.get(NODE_GPUS_ANNOTATION, "[]")
    return [(g.index, g.mem, g.healthy) for g in decode_gpus(value)]


def missing_gauge(rig: Rig) -> float | None:
    assert rig.plugin is not None
    return rig.plugin.metrics.value("gpushare_device_plugin_missing_gpus")


# ----- the merge


def test_a_gpu_found_for_the_first_time_joins():
    current, found = physical("2x16GiB"), physical("3x16GiB")

    merged = reconcile(current, found, held=(), missing=())

    assert merged.gpus == found
    assert [g.index for g in merged.added] == [2]


def test_a_gpu_still_there_keeps_the_health_the_watch_gave_it():
    current = physical("2x16GiB")
    current = (current[0], replace(current[1], gpu=replace(current[1].gpu, healthy=False)))

    merged = reconcile(current, physical("2x16GiB"), held=(), missing=())

    assert [g.gpu.healthy for g in merged.gpus] == [True, False]
    assert merged.added == merged.dropped == merged.missing == ()


def test_a_gpu_gone_that_no_pod_holds_is_dropped():
    merged = reconcile(physical("3x16GiB"), physical("2x16GiB"), held={0}, missing=())

    assert [g.gpu.index for g in merged.gpus] == [0, 1]
    assert [g.index for g in merged.dropped] == [2]


def test_a_gpu_gone_that_a_pod_holds_is_kept_unhealthy_until_it_is_found_again():
    current = physical("3x16GiB")
    gone = physical("2x16GiB")

    kept = reconcile(current, gone, held={2}, missing=())

    assert [(g.gpu.index, g.gpu.healthy) for g in kept.gpus] == [(0, True), (1, True), (2, False)]
    assert [g.index for g in kept.missing] == [2] and kept.dropped == ()

    back = reconcile(kept.gpus, current, held={2}, missing={current[2].gpu.uuid})

    assert back.gpus == current  # healthy again, as discovery reports it
    assert [g.index for g in back.found_again] == [2] and back.missing == ()


def test_a_new_gpu_under_the_index_of_a_missing_one_takes_the_index():
    current = physical("2x16GiB")
    other = PhysicalGpu(Gpu(1, "GPU-other", 24, "L4"), 1)

    merged = reconcile(current, (current[0], other), held={1}, missing=())

    assert merged.gpus == (current[0], other)
    assert [g.uuid for g in merged.dropped] == [current[1].gpu.uuid]


# ----- under a running plugin (mock backend)


def test_a_gpu_added_and_taken_out_again_changes_what_the_node_advertises(make_rig):
    rig = make_rig(layout="2x16GiB", mode="core_mem", rediscover_interval=REDISCOVER).start()
    assert rig.kubelet.capacity(GPU_MEM) == (32, 32)

    rig.backend.set_gpus(parse_layout("2x16GiB,1x24GiB", rig.node))

    assert eventually(lambda: rig.kubelet.capacity(GPU_MEM) == (56, 56))
    assert rig.kubelet.capacity(GPU_COUNT) == (3, 3)
    assert rig.kubelet.capacity("aliyun.com/gpu-core.percentage") == (300, 300)
    assert eventually(lambda: published(rig) == [(0, 16, True), (1, 16, True), (2, 24, True)])

    rig.backend.set_gpus(parse_layout("2x16GiB", rig.node))

    assert eventually(lambda: rig.kubelet.capacity(GPU_MEM) == (32, 32))
    assert eventually(lambda: published(rig) == [(0, 16, True), (1, 16, True)])
    assert missing_gauge(rig) == 0


def test_a_gpu_added_is_watched_for_health(make_rig):
    rig = make_rig(layout="1x16GiB", rediscover_interval=REDISCOVER).start()
    rig.backend.set_gpus(parse_layout("2x16GiB", rig.node))
    assert eventually(lambda: rig.kubelet.capacity(GPU_COUNT) == (2, 2))

    rig.backend.set_healthy(1, False)

    assert eventually(lambda: rig.kubelet.capacity(GPU_COUNT) == (2, 1))
    assert eventually(lambda: published(rig) == [(0, 16, True), (1, 16, False)])


def test_a_gpu_gone_while_a_pod_holds_it_stays_in_the_books_until_the_pod_goes(
    make_rig, caplog: pytest.LogCaptureFixture
):
    rig = make_rig(layout="2x16GiB", rediscover_interval=REDISCOVER).start()
    holder = rig.bind("holder", [[1]], mem=4)
    rig.kubelet.admit(holder)
    rig.wait_assigned("holder")

    with caplog.at_level(logging.ERROR, logger="gpushare.deviceplugin.rediscovery"):
        rig.backend.set_gpus(parse_layout("1x16GiB", rig.node))
        assert eventually(lambda: rig.kubelet.capacity(GPU_MEM) == (32, 16))

    assert eventually(lambda: published(rig) == [(0, 16, True), (1, 16, False)])
    assert "pods bound to this node hold it" in caplog.text
    assert missing_gauge(rig) == 1
    assert rig.plugin is not None
    assert rig.plugin.metrics.value("gpushare_gpu_memory_allocated_gib", gpu="1") == 4

    rig.cluster.delete_pod("default", "holder")

    assert eventually(lambda: rig.kubelet.capacity(GPU_MEM) == (16, 16))
    assert eventually(lambda: published(rig) == [(0, 16, True)])
    assert missing_gauge(rig) == 0


def test_a_listing_that_fails_changes_nothing(make_rig, caplog: pytest.LogCaptureFixture):
    rig = make_rig(layout="2x16GiB").start()
    assert rig.plugin is not None

    def broken() -> tuple[PhysicalGpu, ...]:
        raise RuntimeError("NVML is not available")

    rig.backend.discover = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="gpushare.deviceplugin.rediscovery"):
        rig.plugin.rediscovery.once()

    assert "listing the GPUs again failed (NVML is not available)" in caplog.text
    assert rig.kubelet.capacity(GPU_MEM) == (32, 32)


# ----- under a running plugin (the nvml backend on the fake libnvidia-ml)


def test_a_t4_added_to_and_taken_from_the_driver_is_advertised_and_withdrawn(tmp_path, short_tmp):
    t4s = [FakeGpu(f"GPU-t4-{i}", "Tesla T4", T4_BYTES, minor=i) for i in range(3)]
    with fake_driver(tmp_path, World(t4s[:2])) as driver:

        class FakeDriverGpus(NvmlBackend):
            @classmethod
            def from_layout(cls, *_args, **_kwargs) -> NvmlBackend:
                return cls(pynvml, dev_root=short_tmp, quiet_period=0.1)

        rig = Rig(
            short_tmp / "r",
            layout="2x15GiB",
            backend_type=FakeDriverGpus,  # type: ignore[arg-type]
            rediscover_interval=REDISCOVER,
        )
        try:
            rig.start()
            assert rig.kubelet.capacity(GPU_MEM) == (30, 30)

            driver.world.gpus = t4s
            driver.write()

            assert eventually(lambda: rig.kubelet.capacity(GPU_MEM) == (45, 45))
            assert eventually(lambda: [i for i, _, _ in published(rig)] == [0, 1, 2])

            driver.world.gpus = t4s[:2]
            driver.write()

            assert eventually(lambda: rig.kubelet.capacity(GPU_MEM) == (30, 30))
            assert eventually(lambda: [i for i, _, _ in published(rig)] == [0, 1])
        finally:
            rig.stop()
