"""A memo that keeps at most `limit` entries: the oldest go first.

Memos of computed values (fragmentation per free resources, Scores per best score),
books of pods seen lately and ordered sets of UIDs told about all need a bound on
memory, and each kept its own. `BoundedMemo` is that bound, written (and
mutation-tested) once: an insertion-ordered map whose oldest entry goes when a new
key comes in full. `put` of a key already there makes it the newest (a
least-recently-put book); `refresh` does the same without a new value (a
least-recently-used one); `get` leaves the order alone. An ordered set is a
`BoundedMemo[K, None]` filled with `add`.

Not thread-safe: each user holds it under its own lock, or alone.
"""

from collections import OrderedDict
from collections.abc import Callable, Hashable, ItemsView, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedMemo(Generic[K, V]):
    """At most `limit` entries, oldest first; the oldest goes when a new key comes in
    full. `get` answers None for a key not kept, so a None kept reads as missing: an
    ordered set reads its keys only (`in`, iteration)."""

    __slots__ = ("_entries", "get", "limit")

    get: Callable[[K], V | None]
    """The value kept for the key, None when there is none; the order stays. The
    OrderedDict's own `get`, with no call in Python between: a memo's hits are the
    hot path of the policies that measure fragmentation."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a memo keeps at least one entry, not {limit}")
        self.limit = limit
        """The most entries kept."""
        self._entries: OrderedDict[K, V] = OrderedDict()
        self.get = self._entries.get

    def put(self, key: K, value: V) -> V:
        """Keeps the value for the key, as the newest entry (a key already there moves
        to the end), letting the oldest go when a new key comes in full; returns it."""
        entries = self._entries
        size = len(entries)
        entries[key] = value  # a new key goes last: one look-up for a memo's miss
        if len(entries) == size:  # the key was there
            entries.move_to_end(key)
        elif size >= self.limit:
            del entries[next(iter(entries))]  # the oldest
        return value

    def add(self: "BoundedMemo[K, None]", key: K) -> None:
        """An ordered set's `put`: the key, as the newest."""
        self.put(key, None)

    def refresh(self, key: K) -> bool:
        """Makes the key's entry the newest; False (and nothing done) when there is none."""
        if key not in self._entries:
            return False
        self._entries.move_to_end(key)
        return True

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Forgets the key; its value, or `default` when there was none."""
        return self._entries.pop(key, default)

    def items(self) -> ItemsView[K, V]:
        """(key, value) pairs, oldest first."""
        return self._entries.items()

    def clear(self) -> None:
        self._entries.clear()

    def __getstate__(self) -> tuple[int, "OrderedDict[K, V]"]:
        return self.limit, self._entries

    def __setstate__(self, state: tuple[int, "OrderedDict[K, V]"]) -> None:
        """A copy's (or an unpickled memo's) `get` reads its own entries."""
        self.limit, self._entries = state
        self.get = self._entries.get

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[K]:
        """The keys, oldest first."""
        return iter(self._entries)
