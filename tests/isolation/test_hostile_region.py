"""A tenant owns its region file (its directory is mounted read-write): whatever it makes
of it, the agent keeps ticking, every other container keeps its gates and shares, and the
tenant's container falls back to what applies without the interposer: frozen when its
share says so, its memory held to its cap by the backstop.

Two containers on one GPU of a core_mem node, both always busy and paced at first:
`evil` (30 percent, 2 GiB) and `good` (70 percent, 4 GiB). Their regions are made here
(tests/isolation/regions.py), each with a live slot held by a helper process that names
the container's mock process, as the library's process would.
"""

import ctypes
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from gpushare.isolation.agent import REFRESH_S
from gpushare.isolation.backends.mock import MemoryStep
from gpushare.isolation.backends.port import GIB
from gpushare.isolation.backends.procfs import ProcessTable, parse_ns_pid
from gpushare.isolation.failclosed import MAX_BYTES
from gpushare.isolation.interposer.region import REGION_BYTES, Refusal, Region
from gpushare.isolation.memory import MIB
from gpushare.labels import NodeMode
from gpushare.standins.scenario import Workload
from tests.isolation.regions import (
    gpu_field,
    header_field,
    make_region,
    mutex_holder,
    poke,
    slot_field,
    slot_holder,
)
from tests.isolation.rig import NODE, SLICE, Rig, container_labels, rig
from tests.isolation.test_pacing import region_of

TICKS = 30
TICK_BOUND_S = 0.5
CAPS_GIB = {"evil": 2, "good": 4}


class Node:
    """The rig, its two regions, and the helpers holding their slots."""

    def __init__(self, r: Rig, stack: ExitStack) -> None:
        self.r = r
        self.stack = stack
        self.path = {name: region_of(r, name) for name in ("evil", "good")}
        for name, path in self.path.items():
            path.parent.mkdir(parents=True)
            make_region(path, caps=(CAPS_GIB[name] * GIB,))
            self.attach(name)

    def attach(self, name: str, slot: int = 0) -> None:
        [pid] = self.r.backend.pids(self.r.key(name))
        self.stack.enter_context(slot_holder(self.path[name], slot, pid))

    def ticks(self, count: int = TICKS) -> list[frozenset[str]]:
        """Ticks `count` times, each within the bound; who was frozen at each (and good's
        gate at each, in `good_gates`)."""
        frozen = []
        self.good_gates: list[bool] = []
        with Region.open(self.path["good"]) as good:
            for _ in range(count):
                started = time.perf_counter()
                self.r.agent.tick()
                assert time.perf_counter() - started < TICK_BOUND_S
                frozen.append(self.r.backend.frozen)
                self.good_gates.append(good.gpus()[0].gate_open)
                self.r.clock.advance(SLICE)
        return frozen

    def shown_paced(self, name: str) -> bool:
        return self.r.read(f"{self.r.container_dir(name)}/interposer") == "1\n"

    def sample(self, metric: str, labels: dict[str, str]) -> float | None:
        return self.r.agent.metrics.registry.get_sample_value(metric, labels)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    r = rig(
        tmp_path,
        [
            Workload("evil", CAPS_GIB["evil"], core=30, memory=(MemoryStep(0, GIB),)),
            Workload("good", CAPS_GIB["good"], core=70, memory=(MemoryStep(0, GIB),)),
        ],
        mode=NodeMode.CORE_MEM,
        interposer_dir=tmp_path / "interposer",
    )
    with ExitStack() as stack:
        n = Node(r, stack)
        n.ticks(3)
        assert n.shown_paced("evil") and n.shown_paced("good")
        assert r.backend.frozen == frozenset()
        yield n


def _zero(path: Path) -> None:
    path.write_bytes(bytes(REGION_BYTES))


def _grow(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"\0" * 4096)


def _truncate(path: Path) -> None:
    os.truncate(path, 0)


def _garble_magic(path: Path) -> None:
    poke(path, header_field("magic"), b"garbage!")


def _too_many_gpus(path: Path) -> None:
    poke(path, header_field("gpu_count"), ctypes.c_uint32(1 << 20))


def _odd_slot_count(path: Path) -> None:
    poke(path, header_field("slot_count"), ctypes.c_uint32(7))


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


HOSTILE: dict[str, tuple[Callable[[Path], None], Refusal]] = {
    "truncated": (_truncate, Refusal.SIZE),
    "zeroed": (_zero, Refusal.HEADER),
    "grown": (_grow, Refusal.SIZE),
    "garbled-magic": (_garble_magic, Refusal.HEADER),
    "too-many-gpus": (_too_many_gpus, Refusal.HEADER),
    "odd-slot-count": (_odd_slot_count, Refusal.HEADER),
    "fifo": (_fifo, Refusal.NOT_A_FILE),
    "directory": (_directory, Refusal.NOT_A_FILE),
}


def assert_good_still_paced(n: Node, frozen: list[frozenset[str]]) -> None:
    good = n.r.key("good")
    assert not any(good in f for f in frozen)
    assert n.shown_paced("good")
    with Region.open(n.path["good"]) as region:
        assert region.gpus()[0].share_percent == 70
    # Its gate follows its scheduler: open in about 70 percent of the slices.
    assert sum(n.good_gates[-20:]) / 20 == pytest.approx(0.7, abs=0.15)


def assert_frozen_by_its_share(n: Node, frozen: list[frozenset[str]]) -> None:
    """Not paced: frozen in about 70 percent of the slices, as its 30 percent share says."""
    evil = n.r.key("evil")
    assert not n.shown_paced("evil")
    assert sum(evil in f for f in frozen[-20:]) / 20 == pytest.approx(0.7, abs=0.15)


@pytest.mark.parametrize("hostile", HOSTILE, ids=HOSTILE)
def test_a_region_made_unusable_distrusts_its_container_alone(node: Node, hostile: str) -> None:
    spoil, refusal = HOSTILE[hostile]
    spoil(node.path["evil"])

    frozen = node.ticks()

    assert_frozen_by_its_share(node, frozen)
    assert_good_still_paced(node, frozen)
    labels = container_labels(node.r, "evil")
    del labels["gpu"]
    distrusted = "gpushare_isolation_region_distrusted_total"
    assert node.sample(distrusted, {**labels, "reason": refusal}) == 1
    assert node.sample("gpushare_isolation_distrusted_regions", {"node": NODE}) == 1


def test_a_region_that_reads_again_is_trusted_again(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    content = node.path["evil"].read_bytes()
    with caplog.at_level(logging.INFO, logger="gpushare.isolation.pacing"):
        _garble_magic(node.path["evil"])
        node.ticks(5)
        node.path["evil"].write_bytes(content)
        node.ticks(5)

    assert node.shown_paced("evil")
    assert node.sample("gpushare_isolation_distrusted_regions", {"node": NODE}) == 0
    assert caplog.text.count("cannot be used (") == 1  # one line as it starts...
    assert caplog.text.count("is no longer distrusted: its region reads again") == 1  # ...and ends


def test_a_process_is_matched_by_its_pid_in_its_own_namespace(tmp_path: Path) -> None:
    status = "Name:\tpython\nTgid:\t81234\nNSpid:\t81234\t17\t1\nPPid:\t1\n"
    assert parse_ns_pid(status) == 1
    assert parse_ns_pid("Name:\tpython\n") is None  # before Linux 4.1: never paced
    proc = tmp_path / "proc"
    (proc / "81234").mkdir(parents=True)
    (proc / "81234" / "status").write_text(status)
    assert ProcessTable(proc).ns_pid(81234) == 1
    assert ProcessTable(proc).ns_pid(999) is None  # gone


def test_a_symlink_in_place_of_the_region_is_not_followed(node: Node, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    make_region(outside, caps=(2 * GIB,))  # a valid region: only the link is wrong
    before = outside.read_bytes()
    node.path["evil"].unlink()
    node.path["evil"].symlink_to(outside)

    frozen = node.ticks()

    assert outside.read_bytes() == before  # no gate, no share written through the link
    assert_frozen_by_its_share(node, frozen)
    assert_good_still_paced(node, frozen)


def test_a_fifo_in_place_of_the_region_is_never_opened(node: Node) -> None:
    """Opening a FIFO for reading or writing would block until a peer opens it too; the
    bounded ticks of the parametrized test say it was not. Nothing waits on it either."""
    _fifo(node.path["evil"])
    node.ticks(3)
    reader = os.open(node.path["evil"], os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert os.read(reader, 16) == b""  # no writer has it open: the agent did not
    finally:
        os.close(reader)


def test_a_region_unlinked_and_made_anew_is_followed(node: Node) -> None:
    old = node.path["evil"].with_suffix(".old")
    node.path["evil"].rename(old)
    make_region(node.path["evil"], caps=(2 * GIB,))
    node.attach("evil", slot=5)

    node.ticks(5)

    assert node.shown_paced("evil")
    with Region.open(node.path["evil"]) as region:
        assert region.gpus()[0].share_percent == 30


def test_the_regions_mutex_is_never_taken(node: Node) -> None:
    """A live process holds the region's robust mutex, and a slot looks dead: the agent
    neither waits for the mutex nor reaps the slot (the library does, under its lock)."""
    path = node.path["evil"]
    poke(path, slot_field(9, "pid"), ctypes.c_int32(31337))  # no process holds its lock
    poke(path, slot_field(9, "used"), ctypes.c_uint64(GIB))
    with mutex_holder(path):
        before = path.read_bytes()[header_field("slots") :]
        frozen = node.ticks()
        assert path.read_bytes()[header_field("slots") :] == before  # no slot written
    with Region.open(path) as region:
        assert region.dead() == [31337]
        assert region.gpus()[0].used_bytes == 0  # the dead slot's bytes are not counted
    assert not any(node.r.key("evil") in f for f in frozen)  # still paced: its process is
    assert_good_still_paced(node, frozen)


def test_garbage_over_the_mutex_changes_nothing_for_the_agent(node: Node) -> None:
    poke(node.path["evil"], header_field("lock"), b"\xff" * 64)

    frozen = node.ticks()

    assert node.shown_paced("evil")
    assert_good_still_paced(node, frozen)


def test_forged_counts_in_the_region_do_not_make_a_container_paced(node: Node) -> None:
    """`attached`, the totals and the slots' bytes are the container's to write: only a
    live slot naming each of its GPU processes makes it paced."""
    path = node.path["good"]
    node.stack.close()  # no process holds a slot any more
    for name in node.path:
        poke(node.path[name], header_field("attached"), ctypes.c_uint32(1000))
    poke(path, gpu_field(0, "used_bytes"), ctypes.c_uint64(0))
    [pid] = node.r.backend.pids(node.r.key("good"))
    poke(path, slot_field(0, "pid"), ctypes.c_int32(pid))  # named, but its lock not held

    frozen = node.ticks()

    assert not node.shown_paced("good") and not node.shown_paced("evil")
    assert any(node.r.key("good") in f for f in frozen)
    assert any(node.r.key("evil") in f for f in frozen)


def test_a_second_process_without_the_interposer_unpaces_its_container(node: Node) -> None:
    node.r.backend.start(node.r.key("evil"), 0, mem_bytes=512 * MIB)  # under the cap

    frozen = node.ticks()

    assert node.r.backend.kills == []
    assert_frozen_by_its_share(node, frozen)
    assert_good_still_paced(node, frozen)


def test_a_second_process_without_the_interposer_gets_no_slack(node: Node) -> None:
    """1 GiB + 1.25 GiB: within the slack of two paced processes (1 GiB), but one of them
    is not attached, so the container is held to its 2 GiB cap."""
    rogue = node.r.backend.start(node.r.key("evil"), 0, mem_bytes=GIB + 256 * MIB)

    node.ticks(3)

    assert [k.pid for k in node.r.backend.kills] == [rogue]
    labels = {**container_labels(node.r, "evil"), "action": "kill"}
    assert node.sample("gpushare_isolation_memory_backstop_actions_total", labels) == 0


def test_a_rewritten_cap_does_not_lift_the_backstop(node: Node) -> None:
    """The region says 64 GiB; the container's cap is 2 GiB, plus 512 MiB of slack for its
    one process: 3 GiB per NVML is over it."""
    poke(node.path["evil"], gpu_field(0, "cap_bytes"), ctypes.c_uint64(64 * GIB))
    [pid] = node.r.backend.pids(node.r.key("evil"))
    node.r.backend.allocate(node.r.key("evil"), 0, 3 * GIB)

    node.ticks(2)

    assert [k.pid for k in node.r.backend.kills] == [pid]
    labels = {**container_labels(node.r, "evil"), "action": "kill"}
    assert node.sample("gpushare_isolation_memory_backstop_actions_total", labels) == 1
    assert node.sample("gpushare_isolation_memory_cap_violations_total", labels) == 1


def test_within_the_slack_a_paced_container_is_left_alone(node: Node) -> None:
    node.r.backend.allocate(node.r.key("evil"), 0, 2 * GIB + 500 * MIB)
    node.ticks(5)
    assert node.r.backend.kills == []


def test_the_slack_is_the_agents_configuration(tmp_path: Path) -> None:
    r = rig(
        tmp_path,
        [Workload("evil", 2, core=30, memory=(MemoryStep(0, 2 * GIB + 500 * MIB),))],
        mode=NodeMode.CORE_MEM,
        interposer_dir=tmp_path / "interposer",
        slack_per_process_bytes=256 * MIB,
    )
    path = region_of(r, "evil")
    path.parent.mkdir(parents=True)
    make_region(path, caps=(2 * GIB,))
    [pid] = r.backend.pids(r.key("evil"))
    with slot_holder(path, 0, pid):
        r.agent.tick()
    assert [k.pid for k in r.backend.kills] == [pid]


def test_counters_exist_at_zero_the_publish_before_their_first_event(tmp_path: Path) -> None:
    """At the agent's first look the region is already unusable and the container over
    its cap plus slack: the series are published at 0 first, then moved."""
    r = rig(
        tmp_path,
        [Workload("evil", 2, core=30, memory=(MemoryStep(0, 3 * GIB),))],
        mode=NodeMode.CORE_MEM,
        interposer_dir=tmp_path / "interposer",
        forget_after_s=60,
    )
    path = region_of(r, "evil")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a region")
    labels = container_labels(r, "evil")
    whole = {k: v for k, v in labels.items() if k != "gpu"}

    def sample(name: str, extra: dict[str, str]) -> float | None:
        return r.agent.metrics.registry.get_sample_value(name, extra)

    series = [
        ("gpushare_isolation_memory_cap_violations_total", {**labels, "action": "kill"}),
        ("gpushare_isolation_region_distrusted_total", {**whole, "reason": "size"}),
    ]
    r.agent.tick()
    assert [sample(name, extra) for name, extra in series] == [0, 0]
    r.clock.advance(SLICE)
    r.agent.tick()
    assert [sample(name, extra) for name, extra in series] == [1, 1]


SIGBUS_SCENARIO = textwrap.dedent(
    """
    import os
    from pathlib import Path
    from gpushare.isolation.backends.mock import MemoryStep
    from gpushare.isolation.backends.port import GIB
    from gpushare.labels import NodeMode
    from gpushare.standins.scenario import Workload
    from tests.isolation.regions import make_region, slot_holder
    from tests.isolation.rig import SLICE, rig
    from tests.isolation.test_pacing import region_of

    tmp = Path(os.environ["SCENARIO_DIR"])
    r = rig(tmp, [Workload("evil", 2, core=30, memory=(MemoryStep(0, GIB),))],
            mode=NodeMode.CORE_MEM, interposer_dir=tmp / "interposer")
    path = region_of(r, "evil")
    path.parent.mkdir(parents=True)
    make_region(path, caps=(2 * GIB,))
    [pid] = r.backend.pids(r.key("evil"))
    with slot_holder(path, 0, pid):
        for _ in range(3):
            r.agent.tick()
            r.clock.advance(SLICE)
        os.truncate(path, 0)
        for _ in range(3):
            r.agent.tick()
            r.clock.advance(SLICE)
    print(r.read(f"{r.container_dir('evil')}/interposer").strip())
    """
)


def test_a_region_truncated_under_the_agent_does_not_kill_it(tmp_path: Path) -> None:
    """An agent that mapped the region would die of SIGBUS at its next read: run where a
    signal shows as the exit status."""
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", SIGBUS_SCENARIO],
        cwd=root,
        env={**os.environ, "SCENARIO_DIR": str(tmp_path), "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"  # alive, and the container no longer paced


# --- Processes that fail closed -------------------------------------------------------
# Each keeps `refusing-<pid>` in its container's accounting directory (the library cannot
# trust its grant, cap, region or slot, so refuses every allocation); the agent reads them
# once a second, as untrusted input, into gpushare_isolation_allocations_failed_closed_total
# (their counts summed, never going back) and gpushare_isolation_processes_failed_closed.

ALLOCATIONS = "gpushare_isolation_allocations_failed_closed_total"
PROCESSES = "gpushare_isolation_processes_failed_closed"
REFRESH_TICKS = round(REFRESH_S / SLICE) + 1


def refusing(count: int, reason: str = "ALIYUN_COM_GPU_MEM_CONTAINER=abc is not a cap") -> bytes:
    """What the library writes."""
    return f"{count:020d}\n{reason}\n".encode()


def directory(node: Node, name: str = "evil") -> Path:
    return node.path[name].parent


def failed_closed(node: Node, name: str = "evil") -> tuple[float | None, float | None]:
    """(allocations, processes) the agent exports for the container, after a refresh."""
    node.ticks(REFRESH_TICKS)
    labels = container_labels(node.r, name)
    del labels["gpu"]
    return node.sample(ALLOCATIONS, labels), node.sample(PROCESSES, labels)


def test_the_counter_is_the_sum_of_the_containers_files(node: Node) -> None:
    assert failed_closed(node) == (0, 0)
    (directory(node) / "refusing-10").write_bytes(refusing(3))
    (directory(node) / "refusing-11").write_bytes(refusing(4, "region is foreign"))

    assert failed_closed(node) == (7, 2)
    assert failed_closed(node, "good") == (0, 0)


def test_forged_files_are_skipped_without_error(node: Node, tmp_path: Path) -> None:
    here = directory(node)
    (here / "refusing-12").write_bytes(refusing(5))
    (here / "refusing-13").write_bytes(b"garbage\n")
    (here / "refusing-14").write_bytes(refusing(6) + b"x" * (2 * MAX_BYTES))  # huge
    (here / "refusing-15").write_bytes(refusing(7)[:-1])  # no final newline
    (here / "refusing-16").write_bytes(f"{7:021d}\nwhy\n".encode())  # 21 digits
    (here / "refusing-17").write_bytes(f"{2**64:020d}\nwhy\n".encode())  # beyond 64 bits
    (here / "refusing-18").write_bytes(refusing(8, "a" * 201))  # reason too long
    os.mkfifo(here / "refusing-19")  # opened without waiting for a writer
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(refusing(1000))
    (here / "refusing-20").symlink_to(elsewhere)
    (here / "refusing-21").mkdir()
    for name in ("refusing-x", "refusing-012", "refusing-", "refusing-22.tmp"):
        (here / name).write_bytes(refusing(100))

    assert failed_closed(node) == (5, 1)  # ticks() bounds every tick's time, too
    assert node.shown_paced("evil")  # the region itself is untouched


def test_deleting_or_rewriting_files_does_not_take_the_counter_back(node: Node) -> None:
    here = directory(node)
    for pid, count in ((30, 3), (31, 4), (32, 5)):
        (here / f"refusing-{pid}").write_bytes(refusing(count))
    assert failed_closed(node) == (12, 3)

    (here / "refusing-30").unlink()
    (here / "refusing-31").write_bytes(refusing(1))
    assert failed_closed(node) == (12, 2)

    (here / "refusing-32").write_bytes(refusing(9))  # its process refused 4 more
    assert failed_closed(node) == (16, 2)


def test_a_container_forgotten_drops_its_series(node: Node) -> None:
    (directory(node) / "refusing-40").write_bytes(refusing(2))
    assert failed_closed(node) == (2, 1)

    node.r.backend.remove(node.r.key("evil"))
    node.r.clock.advance(node.r.agent.config.forget_after_s + 1)
    node.r.agent.tick()
    assert failed_closed(node) == (None, None)
