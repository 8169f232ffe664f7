"""The agent's view of the region comes from region.h itself (layout.py): no compiler is
needed to hold it to the header, and an edit of the header moves the Python side with it.
(test_symbols.py compares it with the compiled library's own offsets where a compiler is.)"""

import ctypes

import pytest

from gpushare.isolation.interposer import layout, region
from gpushare.isolation.interposer.region import GpuRecord, RegionRecord, SlotRecord

HEADER = layout.HEADER.read_text()
ALIGNED_GPU = "} __attribute__((aligned(64)));\n\nstruct gs_slot"


def structures(text: str) -> dict[str, type[ctypes.Structure]]:
    """Fresh classes for the region's three structs, filled from `text`."""
    classes = {
        name: type(name, (ctypes.Structure,), {}) for name in ("gs_gpu", "gs_slot", "gs_region")
    }
    layout.define(text, classes)
    return classes


def test_the_fields_the_agent_writes_are_where_the_library_reads_them() -> None:
    assert (GpuRecord.gate.offset, GpuRecord.share_percent.offset) == (80, 84)
    assert GpuRecord.gate_until_ns.offset == 120
    assert (ctypes.sizeof(GpuRecord), ctypes.sizeof(SlotRecord)) == (192, 192)
    assert (RegionRecord.lock.offset, RegionRecord.lock.size) == (40, 64)
    assert (RegionRecord.gpus.offset, RegionRecord.slots.offset) == (128, 128 + 16 * 192)
    assert region.REGION_BYTES == 128 + 16 * 192 + 1024 * 192


def test_the_constants_are_the_headers() -> None:
    assert region.MAGIC == 0x31524853555047
    assert (region.LAYOUT_VERSION, region.MAX_GPUS, region.MAX_SLOTS, region.UUID_BYTES) == (
        2,
        16,
        1024,
        64,
    )
    assert layout.constants(HEADER)["GS_MAX_CAP_BYTES"] == 1 << 50


def test_a_field_added_to_the_header_moves_the_fields_after_it() -> None:
    edited = HEADER.replace("    uint32_t gate; ", "    uint64_t added;\n    uint32_t gate; ")

    gpu = structures(edited)["gs_gpu"]

    assert (gpu.added.offset, gpu.gate.offset, gpu.gate_until_ns.offset) == (80, 88, 128)  # type: ignore[attr-defined]
    assert ctypes.sizeof(gpu) == 192  # still within one 64-byte multiple


def test_constants_and_alignment_in_the_header_size_the_records() -> None:
    edited = (
        HEADER.replace("#define GS_UUID_BYTES 64", "#define GS_UUID_BYTES 100")
        .replace("#define GS_MAX_GPUS 16", "#define GS_MAX_GPUS 4")
        .replace(ALIGNED_GPU, ALIGNED_GPU.replace("aligned(64)", "aligned(128)"))
    )

    made = structures(edited)
    gpu, slot, whole = made["gs_gpu"], made["gs_slot"], made["gs_region"]

    assert (gpu.uuid.size, gpu.cap_bytes.offset) == (100, 104)  # type: ignore[attr-defined]
    assert ctypes.sizeof(gpu) == 256
    assert slot.used.size == 4 * 8  # type: ignore[attr-defined]
    assert whole.gpus.offset == 128 and whole.gpus.size == 4 * 256  # type: ignore[attr-defined]
    assert ctypes.sizeof(slot) == 64


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("    uint32_t gate; ", "    float gate; ", "float"),
        ("    uint32_t gate; ", "    uint32_t gate[GS_NOWHERE]; ", "GS_NOWHERE"),
        (ALIGNED_GPU, ALIGNED_GPU.replace("aligned(64)", "packed"), "packed"),
        ("struct gs_slot {", "struct gs_process {", "gs_slot"),
    ],
    ids=["unknown-type", "unknown-constant", "unknown-attribute", "struct-gone"],
)  # fmt: skip
def test_a_header_form_it_cannot_follow_fails_loudly(old: str, new: str, says: str) -> None:
    assert old in HEADER
    with pytest.raises(layout.HeaderUnreadable, match=says):
        structures(HEADER.replace(old, new, 1))
