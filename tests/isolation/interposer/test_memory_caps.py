"""Every allocation path is held to the cap at the call, however the program found the
function, and a refused request never reaches the driver."""

import re

import pytest

from gpushare.isolation.interposer.region import Region
from tests.fakecuda import GIB, MIB, Container, uuid

MODES = ("link", "dlsym", "getproc")

# The probe's allocation kinds and the driver export each one reaches.
CAPPED = {
    "mem_v1": "cuMemAlloc",
    "mem": "cuMemAlloc_v2",
    "pitch_v1": "cuMemAllocPitch",
    "pitch": "cuMemAllocPitch_v2",
    "async": "cuMemAllocAsync",
    "async_ptsz": "cuMemAllocAsync_ptsz",
    "pool": "cuMemAllocFromPoolAsync",
    "pool_ptsz": "cuMemAllocFromPoolAsync_ptsz",
    "create": "cuMemCreate",
    "array_v1": "cuArrayCreate",
    "array": "cuArrayCreate_v2",
    "array3d_v1": "cuArray3DCreate",
    "array3d": "cuArray3DCreate_v2",
    "mipmap": "cuMipmappedArrayCreate",
}
OUT_OF_MEMORY = "2"
NOT_SUPPORTED = "801"


def results(lines: list[dict[str, str]], op: str) -> list[dict[str, str]]:
    return [line for line in lines if line["op"] == op]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", CAPPED)
def test_an_allocation_over_the_cap_is_refused_before_the_driver_and_its_free_restores(
    container: Container, mode: str, kind: str
) -> None:
    export = CAPPED[kind]
    lines = container.probe(
        mode, "init", "0",
        "alloc", kind, str(768 * MIB),   # within the 1 GiB cap
        "alloc", kind, str(512 * MIB),   # 1,280 MiB: over it
        "reached", "0", "calls", export,
        "free", "0",
        "reached", "0",
        "alloc", kind, str(512 * MIB),   # fits again once the first is freed
    )  # fmt: skip

    allocs = results(lines, "alloc")
    assert [a["rc"] for a in allocs] == ["0", OUT_OF_MEMORY, "0"]
    assert results(lines, "reached")[0]["bytes"] == str(768 * MIB)
    assert results(lines, "calls")[0]["count"] == "1"
    assert results(lines, "free")[0]["rc"] == "0"
    assert results(lines, "reached")[1]["bytes"] == "0"
    assert container.region is not None
    with Region.open(container.region) as region:  # the agent's count of refusals
        assert region.gpus()[0].allocations_refused == 1


@pytest.mark.parametrize("mode", MODES)
def test_memory_at_a_host_location_passes_through_uncapped(container: Container, mode: str) -> None:
    lines = container.probe(
        mode, "init", "0", "alloc", "create_host", str(2 * GIB), "alloc", "mem", str(GIB),
        "free", "0", "free", "1",
    )  # fmt: skip

    assert [a["rc"] for a in results(lines, "alloc")] == [
        "0",
        "0",
    ]  # the host's 2 GiB: not the GPU's
    assert [f["rc"] for f in results(lines, "free")] == ["0", "0"]


@pytest.mark.parametrize("mode", MODES)
def test_unified_memory_is_refused_saying_why_once(container: Container, mode: str) -> None:
    result = container.run_probe(
        mode, "init", "0", "alloc", "managed", str(MIB), "alloc", "managed", str(MIB),
        "calls", "cuMemAllocManaged",
    )  # fmt: skip

    assert "alloc kind=managed rc=801" in result.stdout
    assert "calls function=cuMemAllocManaged count=0" in result.stdout
    said = [line for line in result.stderr.splitlines() if "unified memory" in line]
    assert len(said) == 1
    assert re.fullmatch(
        r"gpushare-cuda\[\d+\]: cuMemAllocManaged refused: unified memory cannot be capped "
        r"under gpushare \(CUDA_ERROR_NOT_SUPPORTED\)",
        said[0],
    )


def test_without_a_region_everything_passes_straight_through(container: Container) -> None:
    container.region = None
    lines = container.probe(
        "link", "init", "0", "alloc", "mem", str(3 * GIB), "alloc", "managed", str(MIB), "info",
    )  # fmt: skip

    assert [a["rc"] for a in results(lines, "alloc")] == ["0", "0"]
    assert results(lines, "info")[0]["total"] == str(4 * GIB)


def test_each_gpu_is_held_to_its_own_cap_matched_by_uuid(container: Container) -> None:
    # The driver numbers the GPUs 0 = uuid(1), 1 = uuid(2); the container lists them the
    # other way round, with caps 1 GiB for uuid(2) and 2 GiB for uuid(1).
    container.devices = ((uuid(1), 4 * GIB), (uuid(2), 4 * GIB))
    container.visible = f"{uuid(2)},{uuid(1)}"
    container.caps = "1,2"
    lines = container.probe(
        "dlsym",
        "init", "0", "alloc", "mem", str(1536 * MIB), "alloc", "mem", str(768 * MIB),
        "init", "1", "alloc", "mem", str(1536 * MIB), "alloc", "mem", str(GIB),
    )  # fmt: skip

    assert [a["rc"] for a in results(lines, "alloc")] == ["0", OUT_OF_MEMORY, OUT_OF_MEMORY, "0"]


def test_without_uuids_the_caps_follow_device_ordinals(container: Container) -> None:
    container.devices = ((uuid(1), 4 * GIB), (uuid(2), 4 * GIB))
    container.visible = "all"
    container.caps = "1,2"
    lines = container.probe(
        "link",
        "init", "0", "alloc", "mem", str(1536 * MIB),
        "init", "1", "alloc", "mem", str(1536 * MIB),
    )  # fmt: skip

    assert [a["rc"] for a in results(lines, "alloc")] == [OUT_OF_MEMORY, "0"]


def test_a_gpu_the_container_does_not_list_is_refused(container: Container) -> None:
    container.devices = ((uuid(1), 4 * GIB), (uuid(2), 4 * GIB))
    container.visible = uuid(1)
    result = container.run_probe(
        "link", "init", "1", "alloc", "mem", str(MIB), "alloc", "mem", str(MIB),
        "calls", "cuMemAlloc_v2",
    )  # fmt: skip

    assert "alloc kind=mem rc=2" in result.stdout
    assert "calls function=cuMemAlloc_v2 count=0" in result.stdout  # never reached
    said = [line for line in result.stderr.splitlines() if "not among" in line]
    assert len(said) == 1 and uuid(2) in said[0]  # once per device


@pytest.mark.parametrize("kind", ["mem_v1", "mem"])
def test_a_driver_handing_out_internal_entry_points_is_still_capped(
    container: Container, kind: str
) -> None:
    # The pointers match no export: the hook is found by the name, version and flags asked.
    container.extra = {"FAKE_CUDA_INTERNAL_POINTERS": "1"}
    lines = container.probe(
        "getproc", "init", "0", "alloc", kind, str(768 * MIB), "alloc", kind, str(512 * MIB),
        "launch", "kernel_ptsz", "0", "calls", CAPPED[kind],
    )  # fmt: skip

    assert [a["rc"] for a in results(lines, "alloc")] == ["0", OUT_OF_MEMORY]
    assert results(lines, "calls")[0]["count"] == "1"
    assert results(lines, "launch")[0]["rc"] == "0"
    with Region.open(container.region) as region:  # type: ignore[arg-type]
        assert region.gpus()[0].launches == 1  # the launch went through the hook
