"""A process that fails closed says so where the node can see it: `refusing-<pid>` in its
accounting directory (the region's), counting the allocations it refused and saying why,
which the agent exports (gpushare_isolation_allocations_failed_closed_total)."""

import re
from pathlib import Path

from tests.fakecuda import CUDA_PRELUDE, GIB, MIB, Container
from tests.isolation.interposer.test_tenant import BIG_GPU, REFUSING, refused_before_the_driver


def refusing_file(directory: Path, pid: int) -> tuple[int, str]:
    """The count and the reason `pid`'s file says, checking its layout on the way."""
    text = (directory / f"refusing-{pid}").read_text()
    match = re.fullmatch(r"(\d{20})\n([^\n]{0,200})\n", text)
    assert match is not None, repr(text)
    return int(match[1]), match[2]


def test_a_process_with_a_bad_cap_counts_its_refusals_in_a_file_beside_the_region(
    container: Container,
) -> None:
    assert container.region is not None
    container.devices = BIG_GPU
    container.caps = "abc"
    [said] = refused_before_the_driver(container, 8 * GIB, 512 * MIB, MIB)
    pid = int(re.findall(r"gpushare-cuda\[(\d+)\]", said)[0])

    count, reason = refusing_file(container.region.parent, pid)
    assert count == 3
    assert reason == said.split(REFUSING, 1)[1]
    assert "ALIYUN_COM_GPU_MEM_CONTAINER=abc" in reason
    assert (container.region.parent / f"refusing-{pid}").stat().st_mode & 0o777 == 0o666


FORK = (
    CUDA_PRELUDE
    + """
import os, sys
assert alloc(1 << 20)[0] == 2
child = os.fork()
if child == 0:
    use_device(0)
    assert alloc(1 << 20)[0] == 2 and alloc(1 << 20)[0] == 2
    print(os.getpid(), flush=True)
    os._exit(0)
os.waitpid(child, 0)
print(os.getpid())
"""
)


def test_a_forked_child_that_refuses_counts_in_a_file_of_its_own(container: Container) -> None:
    assert container.region is not None
    container.caps = "0"
    child, parent = map(int, container.python(FORK).stdout.split())

    assert refusing_file(container.region.parent, parent)[0] == 1
    assert refusing_file(container.region.parent, child)[0] == 2
