"""The library counts what the driver holds, not what was asked: a VMM physical allocation
while a handle or a mapping keeps it, the memory a pool keeps after its allocations are
freed until a trim or a synchronize gives it back, on the pool's own device; and every
free gives back exactly its bytes however many allocations are live."""

from tests.fakecuda import CUDA_PRELUDE, GIB, MIB, Container, uuid

OUT_OF_MEMORY = 2

DRIVER = (
    CUDA_PRELUDE
    + """
from ctypes import POINTER, Structure, byref, c_int, c_size_t, c_ubyte, c_ulonglong, c_void_p
MIB = 1 << 20
class Location(Structure):
    _fields_ = [("type", c_int), ("id", c_int)]
class AllocationProp(Structure):
    _fields_ = [("type", c_int), ("handle_types", c_int), ("location", Location),
                ("win32", c_void_p), ("flags", c_ubyte * 8)]
class PoolProps(Structure):
    _fields_ = [("alloc_type", c_int), ("handle_types", c_int), ("location", Location),
                ("win32", c_void_p), ("max_size", c_size_t), ("reserved", c_ubyte * 56)]
DEVICE, PINNED, THRESHOLD = 1, 1, 4
def counted():
    free, total = c_size_t(), c_size_t()
    check(cuda.cuMemGetInfo_v2(byref(free), byref(total)))
    return (total.value - free.value) // MIB
def reached(device=0):
    return cuda.fakecuda_reached(device) // MIB
def create(mib, device=0):
    prop = AllocationProp(PINNED, 0, Location(DEVICE, device))
    handle = c_ulonglong()
    rc = cuda.cuMemCreate(byref(handle), c_size_t(mib * MIB), byref(prop), c_ulonglong(0))
    return rc, handle.value
def map_(handle, mib):
    address = c_ulonglong()
    check(cuda.cuMemAddressReserve(byref(address), c_size_t(mib * MIB), c_size_t(0),
                                   c_ulonglong(0), c_ulonglong(0)))
    check(cuda.cuMemMap(c_ulonglong(address.value), c_size_t(mib * MIB), c_size_t(0),
                        c_ulonglong(handle), c_ulonglong(0)))
    return address.value
def unmap(address, mib):
    check(cuda.cuMemUnmap(c_ulonglong(address), c_size_t(mib * MIB)))
def release(handle):
    check(cuda.cuMemRelease(c_ulonglong(handle)))
def default_pool(device=0):
    pool = c_void_p()
    check(cuda.cuDeviceGetDefaultMemPool(byref(pool), device))
    return pool
def new_pool(device):
    pool = c_void_p()
    check(cuda.cuMemPoolCreate(byref(pool), byref(PoolProps(PINNED, 0, Location(DEVICE, device)))))
    return pool
def keep_everything(pool):
    check(cuda.cuMemPoolSetAttribute(pool, THRESHOLD, byref(c_ulonglong(1 << 62))))
def alloc_async(mib, pool=None):
    pointer = c_ulonglong()
    if pool is None:
        rc = cuda.cuMemAllocAsync(byref(pointer), c_size_t(mib * MIB), None)
    else:
        rc = cuda.cuMemAllocFromPoolAsync(byref(pointer), c_size_t(mib * MIB), pool, None)
    return rc, pointer.value
def free_async(pointer):
    check(cuda.cuMemFreeAsync(c_ulonglong(pointer), None))
def synchronize():
    check(cuda.cuStreamSynchronize(None))
"""
)


def run(container: Container, code: str) -> list[int]:
    return [int(word) for word in container.python(DRIVER + code).stdout.split()]


def test_mapped_vmm_memory_stays_counted_after_its_handle_is_released(
    container: Container,
) -> None:
    # The CUDA samples' order: create, map, release; the mapping keeps the memory.
    out = run(container, """
rcs = []
for _ in range(3):
    rc, handle = create(900)
    rcs.append(rc)
    if rc == 0:
        map_(handle, 900)
        release(handle)
print(*rcs, counted(), reached())
""")  # fmt: skip

    assert out == [0, OUT_OF_MEMORY, OUT_OF_MEMORY, 900, 900]


def test_the_last_unmap_gives_vmm_memory_back(container: Container) -> None:
    out = run(container, """
rc, handle = create(600)
address = map_(handle, 600)
release(handle)
after_release = counted()
unmap(address, 600)
print(after_release, counted(), reached(), create(900)[0])
""")  # fmt: skip

    assert out == [600, 0, 0, 0]


def test_a_retained_handle_keeps_vmm_memory_counted_until_it_is_released(
    container: Container,
) -> None:
    out = run(container, """
rc, handle = create(600)
address = map_(handle, 600)
retained = c_ulonglong()
check(cuda.cuMemRetainAllocationHandle(byref(retained), c_void_p(address)))
release(handle)
unmap(address, 600)
kept = counted(), reached(), create(600)[0]
release(retained.value)
print(*kept, counted(), reached())
""")  # fmt: skip

    assert out == [600, 600, OUT_OF_MEMORY, 0, 0]


def test_what_a_pool_keeps_after_a_free_stays_counted_until_it_is_trimmed(
    container: Container,
) -> None:
    # A release threshold above what the pool holds: the driver keeps the freed memory.
    out = run(container, """
pool = default_pool()
keep_everything(pool)
rc, pointer = alloc_async(900)
free_async(pointer)
synchronize()
reused, again = alloc_async(900)             # from what the pool keeps: not charged twice
free_async(again)
synchronize()
kept = counted(), reached(), alloc(900 * MIB)[0]
check(cuda.cuMemPoolTrimTo(pool, c_size_t(0)))
print(reused, *kept, counted(), reached(), alloc(900 * MIB)[0], counted())
""")  # fmt: skip

    assert out == [0, 900, 900, OUT_OF_MEMORY, 0, 0, 0, 900]


def test_a_default_pool_gives_its_memory_back_at_a_synchronize(container: Container) -> None:
    # Release threshold 0: the driver keeps the freed memory until the next synchronize.
    out = run(container, """
rc, pointer = alloc_async(900)
free_async(pointer)
before = counted(), alloc(900 * MIB)[0]
synchronize()
print(*before, counted(), reached(), alloc(900 * MIB)[0])
""")  # fmt: skip

    assert out == [900, OUT_OF_MEMORY, 0, 0, 0]


def test_a_destroyed_pool_gives_back_what_it_keeps(container: Container) -> None:
    out = run(container, """
pool = new_pool(0)
keep_everything(pool)
rc, pointer = alloc_async(900, pool)
free_async(pointer)
synchronize()
kept = counted()
check(cuda.cuMemPoolDestroy(pool))
print(kept, counted(), reached(), alloc(900 * MIB)[0])
""")  # fmt: skip

    assert out == [900, 0, 0, 0]


def test_an_async_allocation_is_charged_to_its_pools_device(container: Container) -> None:
    # Device 0 capped at 2 GiB, device 1 at 1 GiB; the calling thread's device is 0.
    container.devices = ((uuid(1), 4 * GIB), (uuid(2), 4 * GIB))
    container.caps = "2,1"
    out = run(container, """
first = alloc_async(900, new_pool(1))[0]
second = alloc_async(900, default_pool(1))[0]    # device 1 would hold 1,800 MiB
print(first, second, alloc(1536 * MIB)[0], reached(0), reached(1))
""")  # fmt: skip

    assert out == [0, OUT_OF_MEMORY, 0, 1536, 900]


def test_a_host_pool_is_not_capped(container: Container) -> None:
    out = run(container, """
pool = c_void_p()
check(cuda.cuMemPoolCreate(byref(pool), byref(PoolProps(PINNED, 0, Location(2, 0)))))
print(alloc_async(2048, pool)[0], counted(), reached())
""")  # fmt: skip

    assert out == [0, 0, 0]


def test_frees_among_many_live_allocations_give_back_exactly_their_bytes(
    container: Container,
) -> None:
    out = run(container, """
import random
live = []
for round in range(2):
    for _ in range(100_000):
        rc, pointer = alloc(4096)
        check(rc)
        live.append(pointer)
    random.Random(round).shuffle(live)
    for pointer in live[: len(live) // 2]:
        free(pointer)
    live = live[len(live) // 2 :]
peak = counted()
for pointer in live:
    free(pointer)
print(len(live), peak, counted(), reached())
""")  # fmt: skip

    assert out == [75_000, 75_000 * 4096 // MIB, 0, 0]
