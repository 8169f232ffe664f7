"""Per request shape, every node's answer, kept ready to be sent.

kube-scheduler asks about thousands of nodes per pod, and between two pods
only the node that took the last pod changed. So each node's evaluation is kept
until that node changes, together with the JSON fragments filter and
prioritize answer with. An answer for 5,000 nodes is then one dict lookup per
node plus a few C-level passes (map, filter, join) over the looked-up entries,
instead of Python code per node: at that size memory traffic, not arithmetic,
is what costs. The entries live in the core's ShapeCache tables (gpushare.shapecache),
which forget a node's entry when it changes.

Prioritize's Scores are relative to the best candidate's (`relative_score`), so a
node's priority is not its own alone. Its fragment is a %-format template,
`{"Host":"node","Score":%s}`, joined in blocks like the other fragments, and the
node's entry names its score (a state's name, `7/fgd-lookahead`, for every node in
that state); the list is each block of templates formatted with the Scores of its
names against the best (one C call a block), kept per best score. The table's
`_ScoreBook` holds the scores the names stand for, so a learned workload that moves
the scores changes the book, not the nodes' entries.
"""

from collections import Counter
from collections.abc import Collection, Hashable, Iterable
from itertools import chain, repeat
from operator import itemgetter
from typing import Any, NamedTuple, Protocol

import orjson

from gpushare.errors import Refusal
from gpushare.extender.wire import for_scheduler
from gpushare.memo import BoundedMemo
from gpushare.placement.fit import Placement, relative_score
from gpushare.shapecache import ShapeTable
from gpushare.state import NodeView


class NodeFit(NamedTuple):
    """One node's answer for one request shape."""

    placement: Placement | None
    refusal: Refusal | None

    @property
    def score(self) -> float | None:
        """The policy's score (0..100) where the pod fits, None where it does not."""
        return None if self.placement is None else self.placement.score


_Entry = tuple[str | None, str | None, str | None, str | None, str, str | None, str | None]
"""A node's answer as filter and prioritize send it: the node name as JSON when
the pod fits; the rule it breaks there when it does not; `"node":"reason"` for
FailedNodes or for FailedAndUnresolvableNodes; its priority as a template,
`{"Host":"node","Score":%s}` (`...,"Score":0}` when the pod does not fit); that
template again when the pod fits (what prioritize sends for the nodes filter
passed); the name of its score in the book when the pod fits. A plain tuple of
strings, which the garbage collector stops tracking."""


_PASSED, _RULE, _FAILED, _UNRESOLVABLE, _PRIORITY, _PASSED_PRIORITY, _SCORE = range(7)
_PART = tuple(itemgetter(part) for part in range(7))
_BLOCK = 128
"""Entries per block: a changed node re-joins its block of fragments, and the answer
joins the blocks."""
_BESTS = 3  # pragma: no mutate: a size
"""Priority lists kept per part, each for its best score: the best moves and comes
back as pods land on the best nodes."""
_RANKED_BESTS = 2 * _BESTS
"""Best scores a book keeps each name's Score against, the oldest going first."""


class _ScoreBook(dict[str, float]):
    """The policy's score each score name in the entries stands for: a state's
    (`7/fgd-lookahead`), written when the state is evaluated, or the score itself
    (`=47.5`, a node evaluated alone), read from the name. A name's score never
    changes in a book (its Scores are kept): a table that moves makes a new book."""

    def __init__(self) -> None:
        super().__init__()
        self._ranks: BoundedMemo[float, _Ranks] = BoundedMemo(_RANKED_BESTS)

    def __missing__(self, name: str) -> float:
        if name[:1] != "=":
            raise KeyError(name)
        score = self[name] = float(name[1:])
        return score

    def ranks(self, best: float | None) -> dict[str, str]:
        """Each name's Score against this best."""
        if best is None:
            return {}  # no template names a score: the pod fits nowhere
        ranks = self._ranks.get(best)
        if ranks is None:
            ranks = self._ranks.put(best, _Ranks(self, best))
        return ranks


class _Ranks(dict[str, str]):
    """Each name's Score against one best score, `relative_score` of its score in the
    book; made once per name met."""

    def __init__(self, book: _ScoreBook, best: float) -> None:
        super().__init__()
        self._book = book
        self._best = best

    def __missing__(self, name: str) -> str:
        rank = self[name] = str(relative_score(self._best, self._book[name]))
        return rank


class Answers:
    """One request's entries for the candidate nodes, in the order given, and the
    JSON made of them, kept once made. The entries are never changed: a candidate
    list asked again with no node changed gets the same object back, and one with
    changed nodes gets a patched copy, which re-joins only the blocks of fragments
    where a node's fragment changed. A priority list is kept for the best score among
    the entries (`best`), and a copy keeps the lists of a few earlier best scores,
    patched like the rest, unless it reads its scores from another book."""

    __slots__ = (
        "_blocks",
        "_joined",
        "_named",
        "_passed_names",
        "_ranked",
        "_ranked_blocks",
        "_rules",
        "book",
        "entries",
    )

    def __init__(self, entries: list[_Entry], book: _ScoreBook | None = None) -> None:
        self.entries = entries
        self.book = _ScoreBook() if book is None else book
        self._blocks: dict[int, list[Any]] = {}
        """Per part of an entry, each block's fragments joined (None: not yet)."""
        self._joined: dict[int, str] = {}
        self._ranked_blocks: dict[tuple[int, float | None], list[str | None]] = {}
        """Per priority part and best score, each block of templates formatted."""
        self._ranked: dict[tuple[int, float | None], str] = {}
        self._rules: dict[str, int] | None = None
        self._named: dict[str, int] | None = None
        """How many entries name each score, once asked for (`best`)."""
        self._passed_names: list[str] | None = None
        """The names that passed, in order, once asked for; a copy whose passed nodes
        are the same keeps the same list object (`AnswerTable.passed_priorities_json`
        recognises it by identity)."""

    def patched(self, changes: list[tuple[int, _Entry]], book: _ScoreBook) -> "Answers":
        """A copy with entries replaced at these positions and its scores read from
        `book`, keeping what they leave as it was."""
        entries = list(self.entries)
        swaps = [(i, entries[i], new) for i, new in changes]
        for i, new in changes:
            entries[i] = new
        copy = Answers(entries, book)
        if all(new[_PASSED] == old[_PASSED] for _, old, new in swaps):
            copy._passed_names = self._passed_names
        for part, blocks in self._blocks.items():
            moved = [i for i, old, new in swaps if new[part] != old[part]]
            copy._blocks[part] = _unjoined(blocks, moved)
            if not moved and part in self._joined:
                copy._joined[part] = self._joined[part]  # pragma: no mutate: saves a join
        if book is self.book:  # the Scores in another book are other Scores
            for key, blocks in self._ranked_blocks.items():
                made_of = itemgetter(key[0], _SCORE)
                moved = [i for i, old, new in swaps if made_of(new) != made_of(old)]
                copy._ranked_blocks[key] = _unjoined(blocks, moved)
                if not moved and key in self._ranked:
                    copy._ranked[key] = self._ranked[key]  # pragma: no mutate: saves a join
        if self._rules is not None:
            copy._rules = _recounted(self._rules, swaps, _RULE)
        if self._named is not None:
            copy._named = _recounted(self._named, swaps, _SCORE)
        return copy

    def _made(self, part: int) -> list[Any]:
        """The part's blocks: each block's fragments joined; for the score names, each
        block's names as a tuple (the values of its priority templates, in order)."""
        entries = self.entries
        blocks = self._blocks.get(part)  # pragma: no mutate: kept blocks only save work
        if blocks is None:
            blocks = self._blocks[part] = [None] * -(-len(entries) // _BLOCK)
        joined = tuple if part == _SCORE else ",".join
        for b, block in enumerate(blocks):
            if block is None:
                fragments = map(_PART[part], entries[b * _BLOCK : (b + 1) * _BLOCK])
                blocks[b] = joined(filter(None, fragments))
        return blocks

    def _json(self, part: int, opening: str, closing: str) -> str:
        joined = self._joined.get(part)  # pragma: no mutate: a kept join only saves work
        if joined is None:
            blocks = self._made(part)
            joined = self._joined[part] = opening + ",".join(filter(None, blocks)) + closing
        return joined

    def _ranked_json(self, part: int) -> str:
        """A priority part's templates, formatted with the Scores against the best."""
        best = self.best()
        key = (part, best)
        joined = self._ranked.get(key)  # pragma: no mutate: a kept join only saves work
        if joined is not None:
            return joined
        templates, names = self._made(part), self._made(_SCORE)
        blocks = self._ranked_blocks.get(key)  # pragma: no mutate: kept blocks only save work
        if blocks is None:
            blocks = self._ranked_blocks[key] = [None] * len(templates)
            lists = [made for made in self._ranked_blocks if made[0] == part]
            for older in lists[:-_BESTS]:  # pragma: no mutate: what is kept only saves work
                del self._ranked_blocks[older]
                self._ranked.pop(older, None)
        rank = self.book.ranks(best).__getitem__
        for b, block in enumerate(blocks):
            if block is None:
                blocks[b] = templates[b] % tuple(map(rank, names[b]))
        joined = self._ranked[key] = "[" + ",".join(filter(None, blocks)) + "]"
        return joined

    def passed_json(self) -> str:
        """The NodeNames array, as JSON."""
        return self._json(_PASSED, "[", "]")

    def fits_nowhere(self) -> bool:
        return self.passed_json() == "[]"

    def passed(self) -> set[str]:
        return {orjson.loads(name) for name in filter(None, map(_PART[_PASSED], self.entries))}

    def passed_names(self) -> list[str]:
        """The names that passed, in the candidates' order: the list kube-scheduler
        sends prioritize when this is filter's answer."""
        if self._passed_names is None:
            self._passed_names = orjson.loads(self.passed_json())
        return self._passed_names

    def failed_json(self) -> str:
        """The FailedNodes object, as JSON."""
        return self._json(_FAILED, "{", "}")

    def unresolvable_json(self) -> str:
        """The FailedAndUnresolvableNodes object, as JSON."""
        return self._json(_UNRESOLVABLE, "{", "}")

    def rules(self) -> dict[str, int]:
        """How many nodes refused the pod, per rule."""
        if self._rules is None:
            self._rules = dict(Counter(filter(None, map(_PART[_RULE], self.entries))))
        return self._rules

    def best(self) -> float | None:
        """The best policy score among the nodes where the pod fits; None where it fits
        nowhere."""
        if self._named is None:
            self._named = Counter(chain.from_iterable(self._made(_SCORE)))
        return max(map(self.book.__getitem__, self._named), default=None)

    def priorities_json(self) -> str:
        """The HostPriorityList, as JSON: each node's Score against the best
        (`relative_score`), 0 where the pod does not fit."""
        return self._ranked_json(_PRIORITY)

    def passed_priorities_json(self) -> str:
        """The HostPriorityList of the nodes that passed, as JSON: prioritize's answer
        for `passed_names()`, kept in blocks like the others, so that after a node
        changes it costs the blocks that changed, not a look-up per node."""
        return self._ranked_json(_PASSED_PRIORITY)


def _unjoined(blocks: list[Any], moved: list[int]) -> list[Any]:
    """The blocks, with those holding these positions to be joined again."""
    if not moved:
        return blocks
    blocks = list(blocks)
    for i in moved:
        blocks[i // _BLOCK] = None
    return blocks


def _recounted(
    counts: dict[Any, int], swaps: list[tuple[int, _Entry, _Entry]], part: int
) -> dict[Any, int]:
    """Counts of a part's values (rules, score names) after entries are swapped."""
    counts = dict(counts)
    for _, old, new in swaps:
        for value, step in ((old[part], -1), (new[part], 1)):
            if value is not None:
                count = counts.get(value, 0) + step
                if count:
                    counts[value] = count
                else:
                    del counts[value]
    return counts


_RECENT = 4
_REBUILD_SHARE = 8
"""A list is answered again from every node's entry rather than patched when more
than one in this many of its nodes changed."""


class _Lookup:
    """A candidate list and its answers, with the names that changed since."""

    def __init__(self, names: list[str], answers: Answers) -> None:
        self.names = names  # pragma: no mutate: a list never matched is looked up afresh
        self.answers = answers
        self.stale: set[str] = set()
        self.positions: dict[str, int] | None = None


State = tuple[int, str]
"""A node's state as the answer depends on it: the number the cache gave its view
without the node's name, and the name of the policy that places pods there."""

ANONYMOUS = "\x00node\x00"
"""The name a state is evaluated under when its answer serves every node in it; each
node's refusal names it in place of this."""
_ANONYMOUS_JSON = orjson.dumps(ANONYMOUS).decode()[1:-1]


class Evaluation(Protocol):
    """How a table gets the answers it has none of, for one request."""

    def state(self, name: str) -> State | None:
        """The node's state, or None when its answer is to be evaluated for it alone
        (a node not known, a policy that may read node names)."""

    def of_state(self, state: State, name: str) -> tuple[NodeView, NodeFit]:
        """The state's view (named ANONYMOUS) and the answer there; `name` is a node in it."""

    def again(self, state: State, view: NodeView) -> NodeFit:
        """The state's answer under the current epochs."""

    def of_node(self, name: str) -> NodeFit:
        """The node's answer, evaluated for it alone."""


class _Answer(NamedTuple):
    """A node's answer, ready to become its entry (or, for a state's answer, the entry of
    any node in that state)."""

    fit: NodeFit
    named: str | None
    """The name of its score in the book; None where the pod does not fit."""
    score: str
    """`,"Score":%s}`, or `,"Score":0}` where the pod does not fit: the end of a priority
    template."""
    reason: str | None
    """The refusal as JSON; ANONYMOUS (as JSON) where the node's name goes in a state's."""

    @classmethod
    def of(cls, fit: NodeFit, state: State | None = None) -> "_Answer":
        """The answer of a state (its score named after it), or of a node alone (its
        score named by itself)."""
        reason = None
        if fit.refusal is not None:
            reason = orjson.dumps(for_scheduler(str(fit.refusal))).decode()
        if fit.score is None:
            return cls(fit, None, ',"Score":0}', reason)
        named = f"{state[0]}/{state[1]}" if state is not None else f"={float(fit.score)!r}"
        return cls(fit, named, ',"Score":%s}', reason)

    def entries(self, names: Collection[str]) -> Iterable[tuple[str, _Entry]]:
        """Each node's entry, as `entry` makes it: after a move renews the entries of
        thousands of nodes in a state that passes, made by C-level maps rather than a
        call per node."""
        if self.reason is not None:
            return ((name, self.entry(name)) for name in names)
        names = list(names)
        keys = list(map(bytes.decode, map(orjson.dumps, names)))
        hosts = map('{"Host":'.__add__, map(str.replace, keys, repeat("%"), repeat("%%")))
        priorities = list(map(str.__add__, hosts, repeat(self.score)))
        none, named = repeat(None), repeat(self.named)
        entries = zip(keys, none, none, none, priorities, priorities, named, strict=False)
        return zip(names, entries, strict=True)  # pragma: no mutate: lengths are equal

    def entry(self, name: str) -> _Entry:
        """The node's entry; in a state's refusal the node's name goes in place of
        ANONYMOUS (JSON and for_scheduler change a text character by character, so the
        name can go in after both). A '%' in the name is written '%%' in the template."""
        key = orjson.dumps(name).decode()
        priority = '{"Host":' + key.replace("%", "%%") + self.score
        if self.reason is None:
            return (key, None, None, None, priority, priority, self.named)
        named = key[1:-1] if "%" not in name else orjson.dumps(for_scheduler(name)).decode()[1:-1]
        reason = key + ":" + self.reason.replace(_ANONYMOUS_JSON, named)
        refusal = self.fit.refusal
        assert refusal is not None
        if refusal.rule.resolvable:
            return (None, refusal.rule.value, reason, None, priority, None, None)
        return (None, refusal.rule.value, None, reason, priority, None, None)


class AnswerTable(ShapeTable[str, _Entry]):
    """One request shape's entries per node, and the candidate lists last answered."""

    def __init__(self, position: int, epochs: Hashable) -> None:
        super().__init__(position, epochs)
        self._by_state: dict[State, tuple[NodeView, _Answer]] = {}
        """The answer for each state a node may be in, whatever the node: most nodes
        of a large cluster are in one of a few states, so a first look evaluates
        those few states rather than every node."""
        self._state_of: dict[str, State] = {}
        """The state each node's entry was made from."""
        self._nodes_in: dict[State, set[str]] = {}
        self._alone: set[str] = set()
        """The nodes whose entry was evaluated for the node alone (no state)."""
        self._book = _ScoreBook()
        """The scores of the states evaluated under the current epochs, by name."""
        self._moved = False
        """The epochs moved since the states were last evaluated (`rebase`)."""
        self._recent: list[_Lookup] = []
        """The last candidate lists answered (filter's and prioritize's), to patch
        rather than look up again when the scheduler sends the same list."""

    def answers(self, names: list[str], evaluation: Evaluation) -> Answers:
        """Every node's entry, evaluating the nodes that have none yet."""
        self._revalidate(evaluation)
        self._spread_stale()
        recent = sorted(self._recent, key=lambda lookup: lookup.names is not names)
        for lookup in recent:  # the same list object first: no need to compare names
            same = lookup.names is names or lookup.names == names
            if same and self._refresh(lookup, evaluation):
                return lookup.answers
        lookup = _Lookup(names, Answers(self._entries(names, evaluation), self._book))
        self._recent = [*self._recent, lookup][-_RECENT:]
        return lookup.answers

    def priorities_json(self, names: list[str], evaluation: Evaluation) -> str:
        """Prioritize's answer for these candidates. When they are the nodes a recent
        filter answer passed (`Answers.passed_names`, recognised by identity: the
        args reader hands back the list filter expected) and none of that answer's
        nodes changed since, it is made from that answer's kept blocks; otherwise
        looked up node by node like any list."""
        for lookup in self._recent:
            if lookup.answers._passed_names is names:
                self._revalidate(evaluation)
                self._spread_stale()
                if self._refresh(lookup, evaluation) and lookup.answers._passed_names is names:
                    return lookup.answers.passed_priorities_json()
                break
        return self.answers(names, evaluation).priorities_json()

    def _entry(self, name: str, evaluation: Evaluation) -> _Entry:
        state = evaluation.state(name)
        if state is None:
            return self._put(name, evaluation.of_node(name))
        known = self._by_state.get(state)
        if known is None:
            view, fit = evaluation.of_state(state, name)
            known = self._by_state[state] = (view, self._answer(state, fit))
        self._state_of[name] = state
        nodes = self._nodes_in.get(state)
        if nodes is None:
            nodes = self._nodes_in[state] = set()
        nodes.add(name)
        entry = self.results[name] = known[1].entry(name)
        return entry

    def _answer(self, state: State, fit: NodeFit) -> _Answer:
        """The state's answer, its score written in the book. A state gone and back
        under the same epochs finds its score there already, and keeps it: a name's
        score does not change in a book, whose Scores are kept."""
        answer = _Answer.of(fit, state)
        if answer.named is not None and fit.score is not None:
            self._book.setdefault(answer.named, fit.score)
        return answer

    def _spread_stale(self) -> None:
        """Hands the nodes that changed to every candidate list kept."""
        if self.stale:
            for lookup in self._recent:
                lookup.stale |= self.stale
            self.stale.clear()

    def forget(self, node: str) -> None:
        super().forget(node)
        self._alone.discard(node)  # pragma: no mutate: a node kept here is only forgotten again
        state = self._state_of.pop(node, None)
        if state is not None:
            nodes = self._nodes_in[state]
            nodes.discard(node)
            if not nodes:  # no node left in this state: let its answer go
                del self._nodes_in[state], self._by_state[state]
                if len(self._book) > 2 * len(self._by_state) + 1024:  # pragma: no mutate: a size
                    self._book = self._live_book()

    def rebase(self, epochs: Hashable) -> bool:
        """Takes the new epochs: the next `answers` evaluates each state again and
        renews the entries of the nodes whose refusal changed, and writes the states'
        new scores in a new book, instead of every node being evaluated afresh.
        Nodes evaluated alone are forgotten: their policy may have moved too."""
        self.epochs = epochs
        self._moved = True
        return True

    def _revalidate(self, evaluation: Evaluation) -> None:
        if not self._moved:
            return
        self._moved = False
        for node in list(self._alone):
            self.forget(node)
        for state, (view, answer) in list(self._by_state.items()):
            new = evaluation.again(state, view)
            if (new.score is None, new.refusal) == (answer.fit.score is None, answer.fit.refusal):
                # The same entries: a score that moved goes in the new book.
                self._by_state[state] = (view, answer._replace(fit=new))
                continue
            # The state's nodes are still in it (a node that changed was forgotten before
            # this): each gets its entry from the new answer at once, as `_entry` would
            # make it, rather than being forgotten, found in its state again and the
            # state evaluated a second time (after a move that changes the answer of
            # thousands of nodes, that was most of the request).
            renewed = _Answer.of(new, state)
            self._by_state[state] = (view, renewed)
            self.results.update(renewed.entries(self._nodes_in[state]))
            self.stale |= self._nodes_in[state]
        self._book = self._live_book()

    def _live_book(self) -> _ScoreBook:
        """A new book of the scores of the states with nodes in them (what a move or
        states come and gone leave in the old one is not carried over)."""
        book = _ScoreBook()
        for _, answer in self._by_state.values():
            if answer.named is not None and answer.fit.score is not None:
                book[answer.named] = answer.fit.score
        return book

    def _refresh(self, lookup: _Lookup, evaluation: Evaluation) -> bool:
        """Patches the entries of the nodes that changed, and reads the scores from the
        current book; False when it cannot (the list names a node twice)."""
        if not lookup.stale:
            if lookup.answers.book is not self._book:
                lookup.answers = lookup.answers.patched([], self._book)
            return True
        if len(lookup.stale) * _REBUILD_SHARE > len(lookup.names):  # pragma: no mutate: cost only
            return self._rebuild(lookup, evaluation)
        if lookup.positions is None:
            lookup.positions = dict(zip(lookup.names, range(len(lookup.names)), strict=False))
        if len(lookup.positions) != len(lookup.names):
            return False
        changed = [
            (i, name) for name in lookup.stale if (i := lookup.positions.get(name)) is not None
        ]
        lookup.stale.clear()
        changes = [
            (i, self.results.get(name) or self._entry(name, evaluation)) for i, name in changed
        ]
        if changes or lookup.answers.book is not self._book:
            lookup.answers = lookup.answers.patched(changes, self._book)
        return True

    def _rebuild(self, lookup: _Lookup, evaluation: Evaluation) -> bool:
        """The list's answers made again from every node's entry: after a move changed
        the answers of many nodes, a look-up per node (in C) costs less than patching
        each change (in Python). The nodes that passed keep their list object when
        they are the same (only so that prioritize takes its short way)."""
        lookup.stale.clear()
        before = lookup.answers
        rebuilt = Answers(self._entries(lookup.names, evaluation), self._book)
        kept = before._passed_names
        same = rebuilt.passed_json() == before.passed_json()
        if kept is not None and same:  # pragma: no mutate: cost only (see above)
            rebuilt._passed_names = kept  # pragma: no mutate: cost only
        lookup.answers = rebuilt
        return True  # pragma: no mutate: False answers the list afresh: cost only

    def _entries(self, names: list[str], evaluation: Evaluation) -> list[_Entry]:
        """Every node's entry, in order, evaluating the nodes that have none."""
        entries = list(map(self.results.get, names))
        if not all(entries):  # entries are non-empty tuples; None marks a node to evaluate
            for i, entry in enumerate(entries):
                if entry is None:
                    entries[i] = self._entry(names[i], evaluation)
        return entries  # type: ignore[return-value]

    def _put(self, name: str, fit: NodeFit) -> _Entry:
        self._alone.add(name)
        entry = self.results[name] = _Answer.of(fit).entry(name)
        return entry
