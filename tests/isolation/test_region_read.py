"""The agent's read of a region: every live slot is found wherever the library or a
tenant put it, and dead ones are told apart, from one copy of the file."""

from contextlib import ExitStack

from gpushare.isolation.interposer.region import MAX_SLOTS, Region
from tests.isolation.regions import make_region, slot_holder


def test_live_slots_are_found_in_every_block_of_the_slot_table(tmp_path):
    path = tmp_path / "cuda-region"
    make_region(path)
    slots = [0, 63, 64, 500, MAX_SLOTS - 1]
    with ExitStack() as held, Region.open(path) as region:
        for slot in slots:
            held.enter_context(slot_holder(path, slot=slot, pid=1000 + slot))
        view = region.view()
    assert [(p.slot, p.pid) for p in view.processes] == [(s, 1000 + s) for s in slots]


def test_a_slot_named_but_not_held_is_dead_not_live(tmp_path):
    path = tmp_path / "cuda-region"
    make_region(path)
    with slot_holder(path, slot=70, pid=7):
        pass  # its holder is gone: the slot still names pid 7, with no lock on it
    with Region.open(path) as region:
        assert region.processes() == []
        assert region.dead() == [7]
