"""The node cache the extender and the simulator share: a node's result is kept until
that node changes, and a table made under other policy knowledge is not reused."""

import pytest

from gpushare.placement.fit import Placement, PlacementPolicy, evaluate, to_allocation
from gpushare.placement.policies import POLICIES, BinpackPolicy, build
from gpushare.shapecache import ShapeCache, ShapeTable
from gpushare.state import NodeState
from tests.builders import T0, node_state, request

Table = ShapeTable[str, object]


def results(cache: ShapeCache[Table], key: str, epochs: int = 0) -> dict[str, object]:
    return cache.table(key, epochs).results


def test_a_result_is_kept_until_its_node_changes():
    cache: ShapeCache[Table] = ShapeCache(ShapeTable)
    table = cache.table("4GiB", 0)
    table.results.update(a="fits", b="fits")
    assert cache.table("4GiB", 0) is table and not table.stale
    cache.changed("a")
    assert results(cache, "4GiB") == {"b": "fits"}
    assert table.stale == {"a"}  # what the owner built on it is out of date
    cache.changed("c")  # a node the table never had a result for
    assert cache.table("4GiB", 0).stale == {"a"}


def test_every_table_catches_up_with_the_same_change():
    cache: ShapeCache[Table] = ShapeCache(ShapeTable)
    for key in ("4GiB", "8GiB"):
        cache.table(key, 0).results["a"] = key
    cache.changed("a")
    assert results(cache, "4GiB") == {} and results(cache, "8GiB") == {}


def test_a_table_made_after_changes_keeps_the_results_it_got_since():
    cache: ShapeCache[Table] = ShapeCache(ShapeTable)
    cache.changed("a")
    table = cache.table("4GiB", 0)
    table.results["a"] = "fits"
    assert results(cache, "4GiB") == {"a": "fits"} and not table.stale


def test_other_epochs_make_a_new_table():
    cache: ShapeCache[Table] = ShapeCache(ShapeTable)
    old = cache.table("4GiB", (("fgd", 0),))
    old.results["a"] = "scored under the old workload"
    new = cache.table("4GiB", (("fgd", 1),))
    assert new is not old and new.results == {}


def test_only_the_most_recently_used_tables_are_kept():
    cache: ShapeCache[Table] = ShapeCache(ShapeTable, limit=2)
    first = cache.table("a", 0)
    cache.table("b", 0).results["n"] = "fits"
    assert cache.table("a", 0) is first  # now the most recent
    cache.table("c", 0)
    assert cache.table("a", 0) is first
    assert cache.table("b", 0).results == {}  # "b" was dropped and made again


def test_a_full_log_brings_every_table_up_to_date_and_starts_again():
    cache: ShapeCache[Table] = ShapeCache(ShapeTable, log_limit=3)
    table = cache.table("4GiB", 0)
    table.results.update(a=1, b=2, c=3, d=4)
    for node in ("a", "b", "c", "d"):
        cache.changed(node)  # the fourth overflows the log
    assert table.results == {} and table.stale == {"a", "b", "c", "d"}
    table.results.update(a=5, b=6)
    cache.changed("b")  # the first change of the new log
    assert cache.table("4GiB", 0).results == {"a": 5}


def test_a_cleared_cache_has_no_tables():
    cache: ShapeCache[Table] = ShapeCache(ShapeTable)
    cache.table("4GiB", 0).results["a"] = 1
    cache.clear()
    assert results(cache, "4GiB") == {}


def test_evaluations_are_reused_until_the_node_changes():
    calls = []

    class Counting(BinpackPolicy):
        name = "counting"

        def place(self, view, req):
            calls.append(view.name)
            return super().place(view, req)

    def fit(cache: ShapeCache[Table], state: NodeState, policy: PlacementPolicy, req) -> object:
        table = cache.table(req.shape, policy.epoch)
        if state.name not in table.results:
            table.results[state.name] = evaluate(state.view(), req, policy)
        return table.results[state.name]

    policy = Counting()
    cache: ShapeCache[Table] = ShapeCache(ShapeTable)
    state = node_state("2x16GiB")
    first = fit(cache, state, policy, request(mem=4))
    assert fit(cache, state, policy, request(name="other", mem=4)) is first  # same shape
    assert isinstance(first, Placement) and len(calls) == 1
    state.add("default/x", to_allocation(request(mem=4), first.assignment, state.inventory, T0))
    cache.changed(state.name)
    assert fit(cache, state, policy, request(mem=4)) is not first and len(calls) == 2
    policy.epoch += 1
    fit(cache, state, policy, request(mem=4))
    assert len(calls) == 3


def test_the_registry_makes_fresh_policies_for_each_user():
    ours, theirs = build(), build()
    assert set(ours) == set(POLICIES)
    assert all(ours[name] is not theirs[name] for name in POLICIES)
    learning = POLICIES["fgd-lookahead"]()
    while learning.epoch == 0:
        learning.observe(request(mem=4))
    assert POLICIES["fgd-lookahead"]().epoch == 0  # learned state stays with its user
    with pytest.raises(TypeError):
        POLICIES["mine"] = BinpackPolicy  # type: ignore[index]
