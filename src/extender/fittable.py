"""Per request shape, every node's answer, kept ready to be sent.

kube-scheduler asks about thousands of nodes per pod, and between two pods
only the node that took the last pod changed. So each node's evaluation is kept
until that node changes, together with the JSON fragments filter and
prioritize answer with. An answer for 5,000 nodes is then one dict lookup per
node plus a few C-level passes (map, filter, join) over the looked-up entries,
instead of Python code per node: at that size memory traffic, not arithmetic,
is what costs.
"""

import json
from collections import Counter
from collections.abc import Callable
from operator import itemgetter
from typing import NamedTuple

from gpushare.errors import Refusal
from gpushare.placement import Placement


class NodeFit(NamedTuple):
    """One node's answer for one request shape."""

    placement: Placement | None
    refusal: Refusal | None
    score: int
    """0..10 for the extender, 0 when refused."""
    reason: str
    """The refusal as the user reads it ("" when the pod fits)."""


_Entry = tuple[str | None, str | None, str | None, str | None, str]
"""A node's answer as filter and prioritize send it: the node name as JSON when
the pod fits; the rule it breaks there when it does not; `"node":"reason"` for
FailedNodes or for FailedAndUnresolvableNodes; `{"Host":"node","Score":n}`.
A plain tuple of strings, which the garbage collector stops tracking."""


_PASSED, _RULE, _FAILED, _UNRESOLVABLE, _PRIORITY = (itemgetter(i) for i in range(5))


class Answers(NamedTuple):
    """One request's entries for the candidate nodes, in the order given."""

    entries: list[_Entry]

    def passed_json(self) -> str:
        """The NodeNames array, as JSON."""
        return "[" + ",".join(filter(None, map(_PASSED, self.entries))) + "]"

    def passed(self) -> set[str]:
        return {json.loads(name) for name in filter(None, map(_PASSED, self.entries))}

    def refused(self) -> list[_Entry]:
        return list(filter(_RULE, self.entries))

    def failed_json(self, refused: list[_Entry]) -> str:
        """The FailedNodes object, as JSON."""
        return "{" + ",".join(filter(None, map(_FAILED, refused))) + "}"

    def unresolvable_json(self, refused: list[_Entry]) -> str:
        """The FailedAndUnresolvableNodes object, as JSON."""
        return "{" + ",".join(filter(None, map(_UNRESOLVABLE, refused))) + "}"

    def rules(self, refused: list[_Entry]) -> Counter[str]:
        return Counter(map(_RULE, refused))

    def priorities_json(self) -> str:
        """The HostPriorityList, as JSON."""
        return "[" + ",".join(map(_PRIORITY, self.entries)) + "]"


_RECENT = 4


class _Lookup:
    """A candidate list and its entries, with the names that changed since."""

    def __init__(self, names: list[str], entries: list[_Entry]) -> None:
        self.names = names
        self.entries = entries
        self.stale: set[str] = set()
        self.positions: dict[str, int] | None = None


class FitTable:
    def __init__(self, position: int, epochs: tuple[int, ...]) -> None:
        self.position = position
        """How far into the cache's change log this table is up to date."""
        self.epochs = epochs
        """The policies' epochs the results were computed under."""
        self._entries: dict[str, _Entry] = {}
        self._recent: list[_Lookup] = []
        """The last candidate lists answered (filter's and prioritize's), to patch
        rather than look up again when the scheduler sends the same list."""

    def forget(self, name: str) -> None:
        if self._entries.pop(name, None) is not None:
            for lookup in self._recent:
                lookup.stale.add(name)

    def answers(self, names: list[str], evaluate: Callable[[str], NodeFit]) -> Answers:
        """Every node's entry, evaluating the nodes that have none yet."""
        for lookup in self._recent:
            if lookup.names == names and self._refresh(lookup, evaluate):
                # A copy: a later request patches the list while this answer is written.
                return Answers(list(lookup.entries))
        entries = list(map(self._entries.get, names))
        if None in entries:
            for i, entry in enumerate(entries):
                if entry is None:
                    entries[i] = self._put(names[i], evaluate(names[i]))
        lookup = _Lookup(names, entries)  # type: ignore[arg-type]
        self._recent = [*self._recent, lookup][-_RECENT:]
        return Answers(list(entries))  # type: ignore[arg-type]

    def _refresh(self, lookup: _Lookup, evaluate: Callable[[str], NodeFit]) -> bool:
        """Patches the entries of the nodes that changed; False when it cannot (the
        list names a node twice)."""
        if not lookup.stale:
            return True
        if lookup.positions is None:
            lookup.positions = {name: i for i, name in enumerate(lookup.names)}
        if len(lookup.positions) != len(lookup.names):
            return False
        for name in lookup.stale:
            i = lookup.positions.get(name)
            if i is not None:
                lookup.entries[i] = self._entries.get(name) or self._put(name, evaluate(name))
        lookup.stale.clear()
        return True

    def _put(self, name: str, fit: NodeFit) -> _Entry:
        key = json.dumps(name)
        priority = f'{{"Host":{key},"Score":{fit.score}}}'
        entry: _Entry
        if fit.refusal is None:
            entry = (key, None, None, None, priority)
        else:
            reason = f"{key}:{json.dumps(fit.reason)}"
            resolvable = fit.refusal.rule.resolvable
            entry = (
                None,
                fit.refusal.rule.value,
                reason if resolvable else None,
                None if resolvable else reason,
                priority,
            )
        self._entries[name] = entry
        return entry
