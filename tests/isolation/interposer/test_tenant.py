"""The library does not trust the container it isolates: a bad cap, a forged or damaged
region, a full slot table, a GPU that is not the container's, or a bad grant refuses
every allocation (fails closed, saying why once) instead of letting it through uncapped;
and under the node's grant nothing the container can change (its environment, the
region's cap_bytes, which process came first) moves the cap."""

import ctypes
import fcntl
import os
import struct
from pathlib import Path
from typing import Final

import pytest

from gpushare.isolation.interposer import build
from gpushare.isolation.interposer.region import MAX_SLOTS, GpuRecord, RegionRecord, SlotRecord
from tests.fakecuda import (
    CUDA_PRELUDE,
    GIB,
    MIB,
    Container,
    FakeCuda,
    grant_text,
    parse_line,
    uuid,
)

OUT_OF_MEMORY: Final = "2"
REFUSING: Final = "refusing every allocation: "
BIG_GPU: Final = ((uuid(0), 16 * GIB),)
"""Room for 8 GiB on the device itself: only the library can refuse it."""
_FLOCK: Final = struct.Struct("@hhqqi4x")  # struct flock on x86_64 / aarch64 Linux


def rcs(stdout: str) -> list[str]:
    """The probe's allocations' results, in order."""
    return [parse_line(line)["rc"] for line in stdout.splitlines() if line.startswith("alloc ")]


def refusals(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if REFUSING in line]


def refused_before_the_driver(container: Container, *allocations: int) -> list[str]:
    """Allocates each size on GPU 0 in one process; asserts none reached the driver and
    returns its one refusal line."""
    commands = [c for size in allocations for c in ("alloc", "mem", str(size))]
    result = container.run_probe("link", "init", "0", *commands, "calls", "cuMemAlloc_v2")
    assert result.returncode == 0, result.stderr
    assert rcs(result.stdout) == [OUT_OF_MEMORY] * len(allocations)
    assert "calls function=cuMemAlloc_v2 count=0" in result.stdout
    said = refusals(result.stderr)
    assert len(said) == 1, result.stderr  # once per process
    return said


def cap_offset(gpu: int) -> int:
    return int(
        RegionRecord.gpus.offset + gpu * ctypes.sizeof(GpuRecord) + GpuRecord.cap_bytes.offset
    )


def region_cap(region: Path, gpu: int = 0) -> int:
    with region.open("rb") as file:
        file.seek(cap_offset(gpu))
        return int.from_bytes(file.read(8), "little")


# --- Legacy mode (no grant): the environment, parsed strictly ---------------------------


@pytest.mark.parametrize(
    "caps", ["0", "abc", "-1", "0.5", "", "17179869184", "1.5", " 1", "1,", "0x1", "1,2", None]
)
def test_a_cap_that_is_not_whole_positive_gib_refuses_every_allocation(
    container: Container, caps: str | None
) -> None:
    # 17179869184 GiB overflows 64 bits as bytes; "1,2" names two caps for one GPU.
    container.devices = BIG_GPU
    container.caps = caps
    said = refused_before_the_driver(container, 8 * GIB, 512 * MIB)

    assert "ALIYUN_COM_GPU_MEM_CONTAINER" in said[0]


REGION_BYTES: Final = ctypes.sizeof(RegionRecord)


@pytest.mark.parametrize(
    "content",
    [b"garbage " * 100, bytes(4096), b"", bytes(REGION_BYTES), bytes(REGION_BYTES + 1)],
    ids=["garbage", "4-KiB", "empty", "zeros-of-its-size", "a-byte-too-long"],
)
def test_a_region_that_is_not_one_refuses_at_once(container: Container, content: bytes) -> None:
    assert container.region is not None
    container.region.write_bytes(content)
    timed = (
        "import time\nstarted = time.monotonic()\n"
        + CUDA_PRELUDE
        + ("print(alloc(8 << 30)[0], alloc(512 << 20)[0], time.monotonic() - started)")
    )
    container.devices = BIG_GPU
    result = container.python(timed)
    big, small, seconds = result.stdout.split()

    assert (big, small) == (OUT_OF_MEMORY, OUT_OF_MEMORY)
    assert float(seconds) < 0.5  # no waiting for a creator: a region is whole or refused
    assert len(refusals(result.stderr)) == 1 and "region" in refusals(result.stderr)[0]


def test_when_every_slot_is_held_the_next_process_is_refused(container: Container) -> None:
    assert container.region is not None
    container.probe("link", "init", "0", "info")  # creates the region
    # 1,024 live holders, forged: a pid in each slot and its liveness byte's OFD lock held.
    descriptor = os.open(container.region, os.O_RDWR)
    try:
        for slot in range(MAX_SLOTS):
            start = RegionRecord.slots.offset + slot * ctypes.sizeof(SlotRecord)
            os.pwrite(descriptor, struct.pack("<i", os.getpid()), start)
            lock = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, start, 1, 0)
            fcntl.fcntl(descriptor, fcntl.F_OFD_SETLK, lock)
        said = refused_before_the_driver(container, 512 * MIB)
    finally:
        os.close(descriptor)  # the holders "die": their locks go

    assert "slots" in said[0]
    # With the holders gone their slots are reaped, and the cap holds as before.
    later = container.run_probe(
        "link", "init", "0", "alloc", "mem", str(512 * MIB), "alloc", "mem", str(768 * MIB)
    )
    assert rcs(later.stdout) == ["0", OUT_OF_MEMORY]


# --- Under a grant: the node decides --------------------------------------------------


def test_the_build_that_reads_a_test_grant_is_a_library_of_its_own(built: FakeCuda) -> None:
    # Same directory, other name and stamp: neither build overwrites or reuses the other.
    assert built.granted_interposer.name != built.interposer.name == build.LIBRARY_NAME
    assert build.source_digest(str(built.grant_path)) != build.source_digest()
    with pytest.raises(ValueError, match="plain text"):
        build.defines('/tmp/a"b')


def grant_for(container: Container, grant: Path, mem_bytes: list[int], **more: str) -> None:
    assert container.region is not None
    uuids = [u for u, _ in container.devices][: len(mem_bytes)]
    grant.write_text(grant_text(container.region, mem_bytes, uuids, **more))
    container.granted = True


@pytest.mark.parametrize("environment", ["cap-1000", "no-region-variable", "no-cap-variable"])
def test_under_a_grant_a_process_cannot_raise_its_cap_with_its_environment(
    container: Container, grant: Path, environment: str
) -> None:
    grant_for(container, grant, [GIB])
    if environment == "cap-1000":
        container.caps = "1000"
    elif environment == "no-region-variable":
        container.region = None
    else:
        container.caps = None
    lines = container.run_probe(
        "link", "init", "0", "alloc", "mem", str(768 * MIB), "alloc", "mem", str(512 * MIB)
    ).stdout

    assert rcs(lines) == ["0", OUT_OF_MEMORY]


def test_a_first_process_with_a_larger_environment_cap_does_not_raise_the_next_ones(
    container: Container, grant: Path
) -> None:
    assert container.region is not None
    grant_for(container, grant, [GIB])
    container.caps = "3"
    first = container.probe("link", "init", "0", "info")  # creates the region
    later = container.run_probe("link", "init", "0", "alloc", "mem", str(2 * GIB)).stdout

    assert first[-1]["total"] == str(GIB)  # its own view shows the grant's cap, too
    assert rcs(later) == [OUT_OF_MEMORY]
    assert region_cap(container.region) == GIB  # what viewers of the region read


def test_a_cap_the_container_rewrites_in_the_region_changes_nothing(
    container: Container, grant: Path
) -> None:
    assert container.region is not None
    grant_for(container, grant, [GIB])
    container.probe("link", "init", "0", "info")
    with container.region.open("r+b") as region:
        region.seek(cap_offset(0))
        region.write((8 * GIB).to_bytes(8, "little"))
    lines = container.probe("link", "init", "0", "alloc", "mem", str(2 * GIB), "info")

    assert [line["rc"] for line in lines[1:]] == [OUT_OF_MEMORY, "0"]  # alloc, info
    assert lines[-1]["total"] == str(GIB)


def test_a_grant_is_enforced_per_gpu_by_uuid_whatever_the_environment_says(
    container: Container, grant: Path
) -> None:
    # The driver numbers the GPUs 0 = uuid(1), 1 = uuid(2); the grant lists them the other
    # way round, uuid(2) capped at 1 GiB and uuid(1) at 2 GiB.
    assert container.region is not None
    container.devices = ((uuid(1), 4 * GIB), (uuid(2), 4 * GIB))
    grant.write_text(grant_text(container.region, [GIB, 2 * GIB], [uuid(2), uuid(1)]))
    container.granted = True
    container.caps, container.visible = "100", "all"
    lines = container.run_probe(
        "dlsym",
        "init", "0", "alloc", "mem", str(1536 * MIB), "alloc", "mem", str(768 * MIB),
        "init", "1", "alloc", "mem", str(1536 * MIB), "alloc", "mem", str(GIB),
    ).stdout  # fmt: skip

    assert rcs(lines) == ["0", OUT_OF_MEMORY, OUT_OF_MEMORY, "0"]


def test_a_grant_without_uuids_caps_the_gpus_by_ordinal(container: Container, grant: Path) -> None:
    assert container.region is not None
    container.devices = ((uuid(1), 4 * GIB), (uuid(2), 4 * GIB))
    grant.write_text(grant_text(container.region, [GIB, 2 * GIB]))
    container.granted = True
    container.caps = "100"
    lines = container.run_probe(
        "link",
        "init", "0", "alloc", "mem", str(1536 * MIB),
        "init", "1", "alloc", "mem", str(1536 * MIB),
    ).stdout  # fmt: skip

    assert rcs(lines) == [OUT_OF_MEMORY, "0"]


def test_a_grant_the_device_plugin_writes_is_read(container: Container, grant: Path) -> None:
    from gpushare import grant as grants  # the writer's own encoding, as the plugin uses it

    assert container.region is not None
    text = grant_text(container.region, [GIB], [uuid(0)], weight="2", future_key="x")
    grant.write_bytes(grants.encode(grants.decode(text.encode())))
    container.granted = True
    container.caps = "100"
    lines = container.run_probe(
        "link", "init", "0", "alloc", "mem", str(768 * MIB), "alloc", "mem", str(512 * MIB)
    ).stdout

    assert rcs(lines) == ["0", OUT_OF_MEMORY]


def test_a_gpu_the_grant_does_not_list_is_refused(container: Container, grant: Path) -> None:
    container.devices = ((uuid(1), 4 * GIB), (uuid(2), 4 * GIB))
    grant_for(container, grant, [GIB])  # uuid(1) only
    container.caps = "1,1"  # the environment would cap uuid(2) at 1 GiB, not refuse it
    result = container.run_probe("link", "init", "1", "alloc", "mem", str(512 * MIB))

    assert rcs(result.stdout) == [OUT_OF_MEMORY]
    assert f"device 1 {uuid(2)} is not among the container's GPUs" in result.stderr


def test_a_region_made_for_other_gpus_is_refused_as_foreign(
    container: Container, grant: Path
) -> None:
    assert container.region is not None
    made_elsewhere = Container(container.built, container.region, visible=uuid(9))
    made_elsewhere.probe("link", "init", "0", "info")  # a legacy region listing uuid(9)
    grant_for(container, grant, [GIB])
    said = refused_before_the_driver(container, 512 * MIB)

    assert "foreign" in said[0]


def valid(**more: str) -> str:
    return grant_text(Path("/run/gpushare/cuda-region"), [GIB], [uuid(0)], **more)


MALFORMED: Final = {
    "empty": "",
    "no-format-line": valid().split("\n", 1)[1],
    "version-2": valid().replace("gpushare-grant=1", "gpushare-grant=2"),
    "key-twice": valid() + f"mem-bytes={8 * GIB}\n",
    "unknown-key-twice": valid() + "later=1\nlater=2\n",
    "no-mem-bytes": valid().replace(f"mem-bytes={GIB}\n", ""),
    "no-region": valid().replace("region=/run/gpushare/cuda-region\n", ""),
    "cap-0": valid(mem_bytes="0"),
    "cap-over-2^50": valid(mem_bytes=str((1 << 50) + 1)),
    "cap-fraction": valid(mem_bytes="1.5"),
    "cap-negative": valid(mem_bytes="-1"),
    "cap-hex": valid(mem_bytes="0x40000000"),
    "cap-space": valid(mem_bytes=f" {GIB}"),
    "cap-empty": valid(mem_bytes=""),
    "caps-17": valid(mem_bytes=",".join([str(GIB)] * 17)),
    "uuids-disagree": valid(uuids=f"{uuid(0)},{uuid(1)}"),
    "not-a-uuid": valid(uuids="0"),
    "indices-disagree": valid(indices="0,1"),
    "core-percent-101": valid(core_percent="101"),
    "relative-region": valid(region="run/gpushare/cuda-region"),
    "line-over-1024": valid(note="x" * 1100),
    "over-4096-bytes": valid(**{f"note{i}": "x" * 900 for i in range(5)}),
    "no-final-newline": valid()[:-1],
    "not-key-value": valid() + "garbage\n",
    "not-ascii": valid(pod="tr\u00e4in"),
    "nul": valid(pod="tr\0in"),
}


@pytest.mark.parametrize("text", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_grant_refuses_every_allocation(
    container: Container, grant: Path, text: str
) -> None:
    # The environment (1 GiB) would allow 512 MiB: the bad grant, not it, decides.
    grant.write_bytes(text.encode("utf-8"))
    container.granted = True
    said = refused_before_the_driver(container, 512 * MIB)

    assert "grant" in said[0]


def test_a_grant_that_cannot_be_read_refuses_every_allocation(
    container: Container, grant: Path
) -> None:
    grant.mkdir()
    container.granted = True
    said = refused_before_the_driver(container, 512 * MIB)

    assert "grant" in said[0]
