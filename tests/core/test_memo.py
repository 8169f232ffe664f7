"""The bounded memo every bounded memo, book and ordered set of the product is: the bound
holds, the oldest goes first, a re-put or a refresh makes an entry the newest."""

import copy
import pickle

import pytest

from gpushare.memo import BoundedMemo


def filled(limit: int, *keys: str) -> BoundedMemo[str, int]:
    memo: BoundedMemo[str, int] = BoundedMemo(limit)
    for value, key in enumerate(keys):
        memo.put(key, value)
    return memo


def test_put_keeps_the_value_and_hands_it_back():
    memo: BoundedMemo[str, int] = BoundedMemo(3)
    assert memo.put("a", 7) == 7
    assert memo.get("a") == 7
    assert "a" in memo and "b" not in memo
    assert len(memo) == 1


def test_a_key_not_kept_gets_none():
    memo = filled(3, "a")
    assert memo.get("b") is None
    assert BoundedMemo[str, int](3).get("a") is None


def test_the_bound_holds_and_the_oldest_goes_first():
    memo = filled(3, "a", "b", "c")
    assert len(memo) == 3  # full, nothing gone yet
    memo.put("d", 3)
    assert list(memo) == ["b", "c", "d"]
    assert memo.get("a") is None and memo.get("d") == 3
    memo.put("e", 4)
    assert list(memo.items()) == [("c", 2), ("d", 3), ("e", 4)]
    assert len(memo) == memo.limit == 3


def test_a_memo_of_one_keeps_the_last_key():
    memo = filled(1, "a", "b")
    assert list(memo.items()) == [("b", 1)]


def test_a_key_put_again_is_the_newest_and_takes_no_room():
    memo = filled(3, "a", "b", "c")
    assert memo.put("a", 9) == 9
    assert list(memo.items()) == [("b", 1), ("c", 2), ("a", 9)]
    memo.put("d", 3)  # full: b, now the oldest, goes
    assert list(memo) == ["c", "a", "d"]


def test_get_leaves_the_order_alone():
    memo = filled(2, "a", "b")
    assert memo.get("a") == 0
    memo.put("c", 2)
    assert list(memo) == ["b", "c"]


def test_a_refreshed_key_outlives_those_put_after_it():
    memo = filled(3, "a", "b", "c")
    assert memo.refresh("a") is True
    assert list(memo) == ["b", "c", "a"]
    memo.put("d", 3)
    memo.put("e", 4)
    assert list(memo) == ["a", "d", "e"]
    assert memo.get("a") == 0  # refreshed, its value unchanged


def test_refreshing_a_key_not_kept_does_nothing():
    memo = filled(2, "a", "b")
    assert memo.refresh("c") is False
    assert list(memo.items()) == [("a", 0), ("b", 1)]


def test_pop_forgets_a_key_and_frees_its_room():
    memo = filled(2, "a", "b")
    assert memo.pop("a") == 0
    assert "a" not in memo and len(memo) == 1
    memo.put("c", 2)  # room for it: b stays
    assert list(memo) == ["b", "c"]


def test_pop_of_a_key_not_kept_answers_the_default():
    memo = filled(2, "a")
    assert memo.pop("b") is None
    assert memo.pop("b", 5) == 5
    assert list(memo) == ["a"]


def test_clear_forgets_everything_and_the_bound_stays():
    memo = filled(2, "a", "b")
    memo.clear()
    assert len(memo) == 0 and list(memo) == [] and memo.get("a") is None
    memo.put("c", 2)
    memo.put("d", 3)
    memo.put("e", 4)
    assert list(memo) == ["d", "e"]


def test_an_ordered_set_adds_keys_and_drops_the_oldest():
    seen: BoundedMemo[str, None] = BoundedMemo(2)
    seen.add("a")
    seen.add("b")
    assert "a" in seen and "b" in seen
    seen.add("a")  # again: now the newest
    seen.add("c")
    assert list(seen) == ["a", "c"]
    assert "b" not in seen


@pytest.mark.parametrize(
    "copied",
    [copy.copy, copy.deepcopy, lambda memo: pickle.loads(pickle.dumps(memo))],
    ids=["copy", "deepcopy", "pickle"],
)
def test_a_copy_reads_and_bounds_its_own_entries(copied):
    memo = filled(2, "a", "b")
    other = copied(memo)
    assert other.limit == 2 and list(other.items()) == [("a", 0), ("b", 1)]
    if copied is not copy.copy:  # a shallow copy shares the entries, as a dict's does
        other.put("c", 2)
        assert other.get("c") == 2 and other.get("a") is None
        assert list(memo.items()) == [("a", 0), ("b", 1)] and memo.get("c") is None


@pytest.mark.parametrize("limit", [0, -1])
def test_a_memo_keeps_at_least_one_entry(limit: int):
    with pytest.raises(ValueError, match=f"a memo keeps at least one entry, not {limit}"):
        BoundedMemo[str, int](limit)
