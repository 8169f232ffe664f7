"""The cap holds for the container as a whole: every process and thread reserves in the
shared region atomically, and what a dead process held comes back."""

import os
import signal
import subprocess
import time
from pathlib import Path

from gpushare.isolation.interposer.region import Region
from tests.fakecuda import CUDA_PRELUDE, GIB, MIB, Container

RACE = (
    CUDA_PRELUDE
    + """
import mmap, os, sys, time
me, rounds = int(sys.argv[1]), int(sys.argv[2])
flags = mmap.mmap(os.open(sys.argv[3], os.O_RDWR), 16)
free(alloc(1 << 20)[1])                 # attached to the region: now both race
flags[8 + me] = 1                       # ready; go when both are
while flags[8] + flags[9] < 2:
    pass
both = granted = refused = 0
for _ in range(rounds):
    rc, pointer = alloc(600 << 20)
    if rc == 0:
        flags[me] = 1                   # holding: the other must not be
        both += flags[1 - me]
        granted += 1
        time.sleep(0.0001)              # hold it a moment, so the other tries meanwhile
        both += flags[1 - me]
        flags[me] = 0
        free(pointer)
    else:
        assert rc == 2, rc
        refused += 1
print(both, granted, refused)
"""
)


def test_two_processes_never_both_hold_600_mib_under_a_1024_mib_cap(
    container: Container, tmp_path: Path
) -> None:
    flags = tmp_path / "flags"
    flags.write_bytes(bytes(16))
    racers = [container.start_python(RACE, str(me), "1000", str(flags)) for me in (0, 1)]
    outcomes = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        outcomes.append([int(n) for n in out.split()])

    assert [both for both, _, _ in outcomes] == [0, 0]
    # They did contend (which one wins is not fair, and need not be).
    assert sum(refused for _, _, refused in outcomes) > 0
    assert sum(granted for _, granted, _ in outcomes) > 0


THREADS = (
    CUDA_PRELUDE
    + """
import random, sys, threading
from gpushare.isolation.interposer.region import Region
free(alloc(1 << 20)[1])                  # the first hooked call creates the region
region = Region.open(sys.argv[1])
cap = region.gpus()[0].cap_bytes
over = []
def worker(seed):
    use_device(0)                        # a context is per thread
    rng = random.Random(seed)
    held = []
    for _ in range(200):
        if held and rng.random() < 0.5:
            free(held.pop(rng.randrange(len(held))))
            continue
        rc, pointer = alloc(rng.randint(1, 160) << 20)
        assert rc in (0, 2), rc
        if rc == 0:
            held.append(pointer)
            if region.gpus()[0].used_bytes > cap:
                over.append(region.gpus()[0].used_bytes)
    for pointer in held:
        free(pointer)
threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
for t in threads: t.start()
for t in threads: t.join()
gpu, mine = region.gpus()[0], region.processes()[0]
print(gpu.used_bytes, mine.used_bytes[0], cuda.fakecuda_reached(0), len(over))
"""
)


def test_sixteen_threads_allocating_and_freeing_end_at_exactly_zero(container: Container) -> None:
    out = container.python(THREADS, str(container.region)).stdout

    used, mine, reached, times_over_cap = (int(n) for n in out.split())
    assert (used, mine, reached, times_over_cap) == (0, 0, 0, 0)


HOLDER = (
    CUDA_PRELUDE
    + """
import sys, time
rc, _ = alloc(int(sys.argv[1]))
print("held" if rc == 0 else f"refused {rc}", flush=True)
time.sleep(60)
"""
)

TAKER = (
    CUDA_PRELUDE
    + """
import sys
print(alloc(int(sys.argv[1]))[0])
"""
)


def kill_holder(container: Container, size: int) -> int:
    holder = container.start_python(HOLDER, str(size))
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    return holder.pid


def test_a_killed_holders_memory_is_reclaimed_by_the_next_allocation_that_needs_it(
    container: Container,
) -> None:
    kill_holder(container, 768 * MIB)
    killed_at = time.monotonic()

    rc = container.python(TAKER, str(768 * MIB)).stdout.strip()

    assert rc == "0"
    assert time.monotonic() - killed_at < 2.0


def test_the_agent_counts_a_killed_process_out_without_touching_the_region(
    container: Container,
) -> None:
    pid = kill_holder(container, 768 * MIB)
    assert container.region is not None
    before = container.region.read_bytes()

    with Region.open(container.region) as region:
        assert region.dead() == [pid]
        assert region.gpus()[0].used_bytes == 0  # what live processes hold
        assert region.processes() == []
        assert region.attached == 1  # the library's count, until it reaps
    assert container.region.read_bytes() == before


def test_a_live_process_is_never_counted_dead(container: Container) -> None:
    holder = container.start_python(HOLDER, str(256 * MIB))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with Region.open(container.region) as region:
            assert region.dead() == []
            assert [p.used_bytes for p in region.processes()] == [(256 * MIB,)]
            assert [p.pid for p in region.processes()] == [holder.pid]
    finally:
        holder.kill()
        holder.wait()


FORK = (
    CUDA_PRELUDE
    + """
import os, sys
from gpushare.isolation.interposer.region import Region
rc, _ = alloc(512 << 20); assert rc == 0
child = os.fork()
if child == 0:
    use_device(0)
    first, _ = alloc(512 << 20)          # the parent's 512 + 512 = the cap
    second, _ = alloc(1 << 20)
    print("child", first, second, flush=True)
    sys.exit(0)                          # a normal exit gives its slot back
os.waitpid(child, 0)
region = Region.open(sys.argv[1])
print("parent", [p.used_bytes[0] for p in region.processes()], alloc(512 << 20)[0])
"""
)


def test_a_forked_child_has_its_own_slot_and_shares_the_cap(container: Container) -> None:
    out = container.python(FORK, str(container.region)).stdout.splitlines()

    assert out == ["child 0 2", f"parent [{512 * MIB}] 0"]


def test_the_first_process_creates_the_region_with_the_containers_caps(
    container: Container,
) -> None:
    container.caps = "3"
    container.probe("link", "init", "0", "info")

    with Region.open(container.region) as region:
        gpu = region.gpus()[0]
        assert (gpu.uuid, gpu.cap_bytes, gpu.used_bytes, gpu.gate_open) == (
            container.devices[0][0],
            3 * GIB,
            0,
            True,
        )
        assert region.attached == 0  # the probe exited and gave its slot back
        assert oct(os.stat(container.region).st_mode & 0o777) == "0o666"


def test_a_later_process_keeps_the_regions_caps(container: Container) -> None:
    container.probe("link", "init", "0", "info")  # creates it with 1 GiB
    container.caps = "3"
    result = container.run_probe("link", "init", "0", "alloc", "mem", str(2 * GIB))

    assert "alloc kind=mem rc=2" in result.stdout
    assert "using the region's" in result.stderr


def test_concurrent_first_processes_agree_on_one_region(container: Container) -> None:
    starters = [
        container.start_probe("link", "init", "0", "alloc", "mem", str(400 * MIB), "sleep", "300")
        for _ in range(4)
    ]
    outputs = [s.communicate(timeout=30)[0] for s in starters]

    granted = sum("alloc kind=mem rc=0" in out for out in outputs)
    assert granted == 2  # 2 x 400 MiB fit in 1 GiB, a third does not
    assert all(s.returncode == 0 for s in starters)


def test_an_unreadable_region_refuses_every_allocation_and_says_so(container: Container) -> None:
    assert container.region is not None
    container.region.write_bytes(b"not a region")
    result = container.run_probe("link", "init", "0", "alloc", "mem", str(2 * GIB))

    assert "alloc kind=mem rc=2" in result.stdout  # fails closed: never uncapped
    assert "refusing every allocation" in result.stderr
    assert subprocess.run(["true"]).returncode == 0
