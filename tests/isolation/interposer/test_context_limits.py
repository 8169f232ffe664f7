"""cuCtxSetLimit reserves device memory: the malloc heap's bytes, and the stack's bytes for
every thread the device holds resident (the fake: 4 SMs x 1,024 threads). What a raise
reserves beyond the defaults (8 MiB heap, 1 KiB stack) counts against the cap before the
driver is asked, as an allocation would; a lower gives it back; cuCtxGetLimit is the
driver's own answer."""

from tests.fakecuda import CUDA_PRELUDE, MIB, Container

OUT_OF_MEMORY = 2
KIB = 1 << 10
DEFAULT_HEAP = 8 * MIB
DEFAULT_STACK = KIB
RESIDENT_THREADS = 4 * 1024

LIMITS = (
    CUDA_PRELUDE
    + """
from ctypes import byref, c_int, c_size_t
STACK, PRINTF, HEAP = 0, 1, 2
MIB = 1 << 20
def set_limit(limit, value):
    return cuda.cuCtxSetLimit(c_int(limit), c_size_t(value))
def get_limit(limit):
    value = c_size_t()
    check(cuda.cuCtxGetLimit(byref(value), c_int(limit)))
    return value.value
def counted():
    free, total = c_size_t(), c_size_t()
    check(cuda.cuMemGetInfo_v2(byref(free), byref(total)))
    return (total.value - free.value) // MIB
def reached():
    return cuda.fakecuda_reached(0) // MIB
"""
)


def run(container: Container, code: str) -> list[int]:
    return [int(word) for word in container.python(LIMITS + code).stdout.split()]


def test_a_heap_raise_past_the_cap_is_refused_before_the_driver(container: Container) -> None:
    # 2 GiB beyond the default heap under a 1 GiB cap, on a 4 GiB device that has it.
    out = run(container, f"""
print(set_limit(HEAP, {DEFAULT_HEAP + 2048 * MIB}), get_limit(HEAP), counted(), reached())
""")  # fmt: skip

    assert out == [OUT_OF_MEMORY, DEFAULT_HEAP, 0, 0]


def test_a_heap_raise_within_the_cap_is_counted_until_the_process_ends(
    container: Container,
) -> None:
    out = run(container, f"""
rc = set_limit(HEAP, {DEFAULT_HEAP + 600 * MIB})
print(rc, counted(), reached(), alloc(600 * MIB)[0], alloc(400 * MIB)[0])
""")  # fmt: skip
    after = run(container, "print(counted(), alloc(900 * MIB)[0])")

    assert out == [0, 600, 600, OUT_OF_MEMORY, 0]
    assert after == [0, 0]  # the process's slot gave it back


def test_lowering_the_heap_gives_back_what_it_no_longer_reserves(container: Container) -> None:
    out = run(container, f"""
check(set_limit(HEAP, {DEFAULT_HEAP + 600 * MIB}))
check(set_limit(HEAP, {DEFAULT_HEAP + 200 * MIB}))
lowered = counted(), reached(), alloc(900 * MIB)[0]
check(set_limit(HEAP, {DEFAULT_HEAP}))
print(*lowered, counted(), reached(), alloc(900 * MIB)[0])
""")  # fmt: skip

    assert out == [200, 200, OUT_OF_MEMORY, 0, 0, 0]


def test_a_stack_raise_is_counted_for_every_resident_thread(container: Container) -> None:
    # 64 KiB more per thread x 4,096 threads = 256 MiB; 320 KiB more would be 1,280 MiB.
    out = run(container, f"""
raised = set_limit(STACK, {DEFAULT_STACK + 64 * KIB}), counted(), reached()
refused = set_limit(STACK, {DEFAULT_STACK + 320 * KIB}), get_limit(STACK), counted()
print(*raised, *refused, alloc(800 * MIB)[0])
""")  # fmt: skip

    assert out == [0, 256, 256, OUT_OF_MEMORY, DEFAULT_STACK + 64 * KIB, 256, OUT_OF_MEMORY]
    assert 64 * KIB * RESIDENT_THREADS == 256 * MIB


def test_cu_ctx_get_limit_is_the_drivers_answer(container: Container) -> None:
    out = run(container, f"""
defaults = get_limit(STACK), get_limit(HEAP)
check(set_limit(PRINTF, 4 * MIB))      # not memory the library counts: passes through
check(set_limit(HEAP, {DEFAULT_HEAP + MIB}))
print(*defaults, get_limit(PRINTF), get_limit(HEAP), counted())
""")  # fmt: skip

    assert out == [DEFAULT_STACK, DEFAULT_HEAP, 4 * MIB, DEFAULT_HEAP + MIB, 1]


def test_a_raise_on_each_path_of_finding_the_driver_is_counted(container: Container) -> None:
    for mode in ("link", "dlsym", "getproc"):
        lines = container.probe(
            mode, "init", "0", "limit", "heap", str(DEFAULT_HEAP + 2048 * MIB),
            "limit", "heap", str(DEFAULT_HEAP + 100 * MIB), "info",
        )  # fmt: skip

        refused, raised, info = lines[1], lines[2], lines[3]
        assert (refused["rc"], refused["now"]) == (str(OUT_OF_MEMORY), str(DEFAULT_HEAP)), mode
        assert (raised["rc"], raised["now"]) == ("0", str(DEFAULT_HEAP + 100 * MIB)), mode
        assert int(info["total"]) - int(info["free"]) == 100 * MIB, mode
