"""The garbage collector is held off while the kubelet's admission calls are answered."""

import gc
from collections.abc import Callable, Iterator

import pytest

from gpushare.deviceplugin.collector import CollectorHold
from gpushare.resources import GPU_MEM
from tests.deviceplugin.rig import eventually


class Call:
    """A gRPC call's context: callbacks run when it ends, as gRPC runs them."""

    def __init__(self, ended: bool = False) -> None:
        self.ended = ended
        self._callbacks: list[Callable[[], None]] = []

    def add_callback(self, callback: Callable[[], None]) -> bool:
        if self.ended:
            return False
        self._callbacks.append(callback)
        return True

    def end(self) -> None:
        self.ended = True
        for callback in self._callbacks:
            callback()


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_collector_is_off_until_the_call_ends(collector_on):
    hold, call = CollectorHold(), Call()

    hold.during(call)
    assert not gc.isenabled()

    call.end()
    assert gc.isenabled()


def test_overlapping_calls_keep_it_off_until_the_last_one_ends(collector_on):
    hold, first, second = CollectorHold(), Call(), Call()
    hold.during(first)
    hold.during(second)

    first.end()
    assert not gc.isenabled()

    second.end()
    assert gc.isenabled()


def test_a_call_that_already_ended_leaves_it_on(collector_on):
    hold = CollectorHold()

    hold.during(Call(ended=True))

    assert gc.isenabled()


def test_a_collector_someone_else_turned_off_stays_off(collector_on):
    gc.disable()
    hold, call = CollectorHold(), Call()

    hold.during(call)
    call.end()

    assert not gc.isenabled()


def test_over_grpc_allocate_runs_with_the_collector_off_and_turns_it_back_on(
    make_rig, collector_on
):
    rig = make_rig(layout="1x16GiB").start()
    seen: list[bool] = []
    allocate = rig.plugin.allocator.allocate

    def observed(*args, **kwargs):
        seen.append(gc.isenabled())
        return allocate(*args, **kwargs)

    rig.plugin.allocator.allocate = observed
    pod = rig.bind("held", [[0]], mem=2)

    [main] = rig.kubelet.admit(pod)

    assert main.device_ids[GPU_MEM]
    assert seen == [False]
    assert eventually(gc.isenabled)
