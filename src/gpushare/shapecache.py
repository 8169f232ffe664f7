"""Per request shape, every node's result, kept until that node changes.

A scheduler asks about every node for each pod, and between two pods only the
node that took the last pod changed. So a node's result (its evaluation, or
whatever its owner made of it) is kept per key (a request shape, and whatever
else decides the result) until the owner says the node changed, and a table
made under other policy knowledge (another epoch) is not reused, unless its owner
rebases it (checks its results against the new knowledge itself). The extender
keeps its per-node answers ready to send in these tables, the simulator its
heap of the best nodes; both then evaluate one node per pod instead of all.

Changes go to one log, and each table remembers how far into it it is up to
date: a change costs one append, whatever the number of tables, and a table
catches up when it is next asked for.
"""

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

Node = TypeVar("Node", bound=Hashable)
Result = TypeVar("Result")

LOG_LIMIT = 50_000
"""Changes logged before every table catches up and the log starts again."""


class ShapeTable(Generic[Node, Result]):
    """One key's results per node. Owners may subclass it to keep what they build
    on the results beside them (the extender its recent answers, the simulator
    its heap); results are never None."""

    def __init__(self, position: int, epochs: Hashable) -> None:
        self.position = position
        """How far into the cache's change log this table is up to date."""
        self.epochs = epochs
        """The policies' knowledge (epochs) the results were computed under."""
        self.results: dict[Node, Result] = {}
        self.stale: set[Node] = set()
        """Nodes whose result was forgotten since the owner last emptied this set:
        what it built on those results is out of date."""

    def forget(self, node: Node) -> None:
        if self.results.pop(node, None) is not None:
            self.stale.add(node)

    def rebase(self, epochs: Hashable) -> bool:
        """Whether this table takes results under other epochs from now on, its owner
        checking the results it holds before it answers from them (then `epochs` is
        set to the new ones); False (this default) and the cache starts a new table."""
        return False


Table = TypeVar("Table", bound=ShapeTable[Any, Any])


class ShapeCache(Generic[Table]):
    """Tables by key, the `limit` most recently used (None: all), and the log of
    the nodes that changed."""

    def __init__(
        self,
        new_table: type[Table],
        limit: int | None = None,
        log_limit: int = LOG_LIMIT,
    ) -> None:
        self._new_table = new_table
        self._limit = limit
        self._log_limit = log_limit
        self._tables: OrderedDict[Hashable, Table] = OrderedDict()
        self._log: list[Hashable] = []

    def changed(self, node: Hashable) -> None:
        """Say that a node changed: every table forgets its result when next asked for."""
        self._log.append(node)
        if len(self._log) > self._log_limit:
            for table in self._tables.values():
                self._catch_up(table)
                table.position = 0  # pragma: no mutate: None slices the log from 0 alike
            self._log.clear()

    def clear(self) -> None:
        """Forget every table (after a re-list, when no node's result can be trusted)."""
        self._tables.clear()
        self._log.clear()

    def table(self, key: Hashable, epochs: Hashable) -> Table:
        """The key's table, caught up with the changes; a new, empty one when there is
        none yet or it was made under other epochs."""
        table = self._tables.get(key)
        if table is None or (table.epochs != epochs and not table.rebase(epochs)):
            table = self._tables[key] = self._new_table(len(self._log), epochs)
            if self._limit is not None and len(self._tables) > self._limit:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(key)
            self._catch_up(table)
        return table

    def _catch_up(self, table: Table) -> None:
        for node in self._log[table.position :]:
            table.forget(node)
        table.position = len(self._log)
