"""Reads filter and prioritize bodies without decoding a candidate list seen before.

With nodeCacheCapable true, kube-scheduler sends every pod's filter and
prioritize with the same few sets of NodeNames (the nodes that passed its own
filters, then ours), and decoding 5,000 names through the full model is most of
what a request costs. Go writes NodeNames as the last member of ExtenderArgs, so
a body `H,"NodeNames":X}` is read as two documents: `H}` (the Pod and Nodes, a
small one) through the model, and X with orjson. A body that ends with
the exact bytes of a tail read recently is not decoded again: it gets the same
list object, which the cache then recognises by identity. Filter's answer says
which list prioritize will bring (the nodes that passed, in the order given, which
kube-scheduler sends back as they came), so filter tells the reader to expect it
(`expect`): prioritize then gets filter's own list object.

kube-scheduler filters nodes in parallel and lists those that pass its own filters
in the order its workers finish, so filter's candidates come in a different order
for each pod. A list that holds exactly the names of one remembered (as many names,
the same set, none twice) is read as that remembered list, in its order: answers
name nodes, never positions (kube-scheduler looks each name up), so a list's order
is free, and the cache goes on answering one list object. Such a body is not
remembered itself: its order will not come again.

Why this reads what a full parse reads: when `H}` parses as ExtenderArgs, that
`}` closed the top-level object, so in the whole body X is the value of its last
top-level member, which wins over any earlier NodeNames as in a full parse; and
X is taken only as an array of ASCII strings without \\u escapes, which both
decoders read alike.
Any body that does not fit (another layout, an error) takes the full parse,
which alone decides errors and their messages.
"""

import threading
from collections import OrderedDict

import orjson

from gpushare.extender.wire import ExtenderArgs, WireError, parse

_TAILS = 16
"""Candidate lists remembered (filter's and prioritize's for several request shapes)."""


class ExtenderArgsReader:
    def __init__(self, remembered: int = _TAILS) -> None:
        self._remembered = remembered
        self._tails: OrderedDict[bytes, list[str]] = OrderedDict()
        self._sets: dict[int, tuple[list[str], frozenset[str]]] = {}
        """Each remembered list's names as a set, once asked for (by id, with the list)."""
        self._expected: dict[int, bytes] = {}
        """The tail expected for each list object `expect` was given (by id; kept with
        the list in `_tails`)."""
        self._lock = threading.Lock()

    def expect(self, names: list[str], names_json: str) -> None:
        """A body whose NodeNames are `names_json` (how kube-scheduler writes `names`:
        compact JSON) is to be read as `names`, this very object."""
        with self._lock:
            tail = self._expected.get(id(names))
            if tail is not None and self._tails.get(tail) is names:
                self._tails.move_to_end(tail)
                return
            tail = b',"NodeNames":' + names_json.encode() + b"}"
            self._expected[id(names)] = tail
            self._remember(tail, names)

    def _remember(self, tail: bytes, names: list[str]) -> None:
        """Called with the lock held."""
        self._tails[tail] = names
        self._tails.move_to_end(tail)
        while len(self._tails) > self._remembered:
            _, gone = self._tails.popitem(last=False)  # a list is kept under one tail
            self._expected.pop(id(gone), None)
            self._sets.pop(id(gone), None)

    def _same_names(self, names: list[str]) -> list[str] | None:
        """A remembered list of exactly these names, now the most recently used, or None
        (called with the lock held)."""
        asked: set[str] | None = None
        for tail, known in self._tails.items():
            if len(known) != len(names):
                continue
            if asked is None:
                asked = set(names)
                if len(asked) != len(names):
                    return None  # a name twice: the list is read as it is
            kept = self._sets.get(id(known))
            if kept is None or kept[0] is not known:
                kept = self._sets[id(known)] = (known, frozenset(known))
            if kept[1] == asked:
                # Its own bytes may never come again (each pod's order is new): used
                # this way it must stay remembered, or a later pod's list is new.
                self._tails.move_to_end(tail)
                return known
        return None

    def read(self, body: bytes) -> ExtenderArgs:
        """The body as ExtenderArgs, exactly as `wire.parse` reads it (same errors)."""
        args = self._known_tail(body)
        if args is None:
            args = self._split(body)
        if args is None:
            args = parse(ExtenderArgs, body)
        return args

    def _known_tail(self, body: bytes) -> ExtenderArgs | None:
        with self._lock:
            known = [(tail, names) for tail, names in self._tails.items() if body.endswith(tail)]
        for tail, names in known:
            head = _head(body, len(body) - len(tail))
            if head is None:
                return None
            with self._lock:
                if tail in self._tails:
                    self._tails.move_to_end(tail)
            return head.model_copy(update={"node_names": names})
        return None

    def _split(self, body: bytes) -> ExtenderArgs | None:
        """Reads a body ending in `,"NodeNames":[...]}` as its head and its list,
        remembering the list; None when the body is not written that way or either
        part does not read (the full parse then names the error)."""
        key = body.rfind(b'"NodeNames"')
        if key < 1 or not body.endswith(b"}"):
            return None
        comma = len(body[:key].rstrip()) - 1
        after = body[key + len(b'"NodeNames"') : -1].lstrip()
        if body[comma : comma + 1] != b"," or after[:1] != b":":
            return None
        names = _names(after[1:])
        if names is None:
            return None
        head = _head(body, comma)
        if head is None:
            return None
        tail = body[comma:]
        with self._lock:
            same = self._same_names(names)
            if same is None:
                self._remember(tail, names)
            else:
                names = same
        return head.model_copy(update={"node_names": names})


def _head(body: bytes, end: int) -> ExtenderArgs | None:
    """The body up to `end` (its last member left out), closed, as ExtenderArgs."""
    try:
        head: ExtenderArgs = parse(ExtenderArgs, body[:end] + b"}")
    except WireError:
        return None
    return head


def _names(value: bytes) -> list[str] | None:
    """A JSON array of strings, decoded as pydantic would; None for anything else.
    Only ASCII without \\u escapes is taken (node names are DNS names): there every
    JSON decoder reads alike, whatever each makes of lone surrogate escapes."""
    if not value.isascii() or b"\\u" in value or value.count(b"[") != 1:
        # One '[': a flat array, as names never hold one; deep nesting is left to the
        # full parse, which refuses it with its own message.
        return None
    try:
        names = orjson.loads(value)
        "".join(names)  # a TypeError unless every element is a string
    except (ValueError, TypeError):
        return None
    if type(names) is not list:
        return None
    return names
