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
_PRIORITY_AT = 4


class Answers:
    """One request's entries for the candidate nodes, in the order given, and the
    JSON made of them, kept once made. The entries are never changed: a candidate
    list asked again with no node changed gets the same object back, and one with
    changed nodes gets a patched copy, which keeps what filter sends when only the
    scores changed."""

    __slots__ = ("_made", "entries")

    def __init__(self, entries: list[_Entry], scores_changed_only: "Answers | None" = None):
        self.entries = entries
        self._made: dict[str, object] = {}
        if scores_changed_only is not None:
            made = scores_changed_only._made
            self._made = {key: value for key, value in made.items() if key != "priorities"}

    def passed_json(self) -> str:
        """The NodeNames array, as JSON."""
        made = self._made.get("passed")
        if made is None:
            made = self._made["passed"] = (
                "[" + ",".join(filter(None, map(_PASSED, self.entries))) + "]"
            )
        return made  # type: ignore[return-value]

    def passed(self) -> set[str]:
        return {json.loads(name) for name in filter(None, map(_PASSED, self.entries))}

    def refused(self) -> list[_Entry]:
        made = self._made.get("refused")
        if made is None:
            made = self._made["refused"] = list(filter(_RULE, self.entries))
        return made  # type: ignore[return-value]

    def failed_json(self) -> str:
        """The FailedNodes object, as JSON."""
        made = self._made.get("failed")
        if made is None:
            made = self._made["failed"] = (
                "{" + ",".join(filter(None, map(_FAILED, self.refused()))) + "}"
            )
        return made  # type: ignore[return-value]

    def unresolvable_json(self) -> str:
        """The FailedAndUnresolvableNodes object, as JSON."""
        made = self._made.get("unresolvable")
        if made is None:
            made = self._made["unresolvable"] = (
                "{" + ",".join(filter(None, map(_UNRESOLVABLE, self.refused()))) + "}"
            )
        return made  # type: ignore[return-value]

    def rules(self) -> dict[str, int]:
        """How many nodes refused the pod, per rule."""
        made = self._made.get("rules")
        if made is None:
            made = self._made["rules"] = dict(Counter(map(_RULE, self.refused())))
        return made  # type: ignore[return-value]

    def priorities_json(self) -> str:
        """The HostPriorityList, as JSON."""
        made = self._made.get("priorities")
        if made is None:
            made = self._made["priorities"] = "[" + ",".join(map(_PRIORITY, self.entries)) + "]"
        return made  # type: ignore[return-value]


_RECENT = 4


class _Lookup:
    """A candidate list and its answers, with the names that changed since."""

    def __init__(self, names: list[str], answers: Answers) -> None:
        self.names = names
        self.answers = answers
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
        recent = sorted(self._recent, key=lambda lookup: lookup.names is not names)
        for lookup in recent:  # the same list object first: no need to compare names
            if (lookup.names is names or lookup.names == names) and self._refresh(lookup, evaluate):
                return lookup.answers
        entries = list(map(self._entries.get, names))
        if not all(entries):  # entries are non-empty tuples; None marks a node to evaluate
            for i, entry in enumerate(entries):
                if entry is None:
                    entries[i] = self._put(names[i], evaluate(names[i]))
        lookup = _Lookup(names, Answers(entries))  # type: ignore[arg-type]
        self._recent = [*self._recent, lookup][-_RECENT:]
        return lookup.answers

    def _refresh(self, lookup: _Lookup, evaluate: Callable[[str], NodeFit]) -> bool:
        """Patches the entries of the nodes that changed; False when it cannot (the
        list names a node twice)."""
        if not lookup.stale:
            return True
        if lookup.positions is None:
            lookup.positions = dict(zip(lookup.names, range(len(lookup.names)), strict=False))
        if len(lookup.positions) != len(lookup.names):
            return False
        changed = [
            (i, name) for name in lookup.stale if (i := lookup.positions.get(name)) is not None
        ]
        lookup.stale.clear()
        if not changed:
            return True
        entries = list(lookup.answers.entries)
        scores_only = True
        for i, name in changed:
            entry = self._entries.get(name) or self._put(name, evaluate(name))
            scores_only = scores_only and entry[:_PRIORITY_AT] == entries[i][:_PRIORITY_AT]
            entries[i] = entry
        lookup.answers = Answers(entries, lookup.answers if scores_only else None)
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
