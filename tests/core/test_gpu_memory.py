"""A GPU's memory in whole GiB, from the bytes NVML reports: rounded up as ACK counts it."""

import pytest

from gpushare.inventory import MemoryRounding, gpu_mem_gib

MIB = 1 << 20


@pytest.mark.parametrize(
    ("mib", "gib"),
    [
        (15_109, 15),  # Tesla T4: ACK's ALIYUN_COM_GPU_MEM_DEV=15
        (22_731, 23),  # A10, the smallest total seen: ACK's ALIYUN_COM_GPU_MEM_DEV=23
        (23_028, 23),  # A10, the largest (22.49 GiB: round-to-nearest would say 22)
        (16_384, 16),  # exactly 16 GiB
        (81_920, 80),  # A100 80GB
        (81_559, 80),  # H100 80GB
        (143_771, 141),  # H200
    ],
)
def test_rounds_up_to_the_next_whole_gib(mib, gib):
    assert gpu_mem_gib(mib * MIB) == gib


@pytest.mark.parametrize(("mib", "gib"), [(15_109, 14), (22_731, 22), (23_028, 22), (16_384, 16)])
def test_rounding_down_is_the_open_source_plugins_mib_over_1024(mib, gib):
    assert gpu_mem_gib(mib * MIB, MemoryRounding.DOWN) == gib


def test_bytes_beyond_the_last_whole_mib_do_not_add_a_gib():
    """nvidia-smi shows whole MiB; a few bytes over 16 GiB are still a 16 GiB GPU."""
    assert gpu_mem_gib(16 * 1024 * MIB + 4096) == 16
    assert gpu_mem_gib(15_843_721_216) == 15  # a T4's total in bytes (15,109.75 MiB)


def test_no_memory_is_no_gib():
    assert gpu_mem_gib(0) == 0
    assert gpu_mem_gib(0, MemoryRounding.DOWN) == 0


def test_one_mib_over_a_gib_counts_as_the_next_gib_up_and_not_down():
    assert gpu_mem_gib(16 * 1024 * MIB + MIB) == 17
    assert gpu_mem_gib(16 * 1024 * MIB + MIB, MemoryRounding.DOWN) == 16


@pytest.mark.parametrize("total", [0, 1, MIB - 1, -MIB])
def test_a_gpu_reporting_under_a_mib_or_nonsense_counts_as_no_memory(total):
    assert gpu_mem_gib(total) == 0
