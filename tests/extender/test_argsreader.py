"""The fast reader of filter and prioritize bodies reads exactly what the full model
parse reads, for bodies it takes apart and for those it leaves to the full parse,
the first time and when the candidate list is one it has seen."""

import json

import pytest

from gpushare.extender.argsreader import ExtenderArgsReader
from gpushare.extender.wire import ExtenderArgs, WireError, parse
from tests.builders import pod
from tests.extender.harness import pod_json

POD = json.dumps(pod_json(pod("p", mem=1)), separators=(",", ":"))
NAMES = json.dumps([f"node-{i:03d}" for i in range(50)], separators=(",", ":"))

BODIES = [
    # As kube-scheduler writes it (Go: compact, NodeNames last).
    f'{{"Pod":{POD},"Nodes":null,"NodeNames":{NAMES}}}',
    # As Python's json.dumps writes it.
    json.dumps({"Pod": json.loads(POD), "Nodes": None, "NodeNames": json.loads(NAMES)}),
    f'{{"Pod":{POD} , "NodeNames" :\n {NAMES} }}',
    f'{{"Pod":{POD},"NodeNames":[]}}',
    f'{{"NodeNames":{NAMES},"Pod":{POD}}}',  # NodeNames not last
    f'{{"NodeNames":{NAMES}}}',
    # Twice: the last one wins, in both readers.
    f'{{"Pod":{POD},"NodeNames":["a"],"NodeNames":{NAMES}}}',
    f'{{"Pod":{POD},"NodeNames":null,"NodeNames":{NAMES}}}',
    f'{{"Pod":{POD},"NodeNames":{NAMES},"NodeNames":["a"]}}',
    # Names the two JSON decoders could read differently are left to the full parse.
    f'{{"Pod":{POD},"NodeNames":["n\\u00e9","\\u6771\\u4eac"]}}',
    f'{{"Pod":{POD},"NodeNames":["a\\ud800"]}}',
    f'{{"Pod":{POD},"NodeNames":[1,"a"]}}',
    f'{{"Pod":{POD},"NodeNames":"a"}}',
    f'{{"Pod":{POD},"NodeNames":["a",]}}',
    f'{{"Pod":{POD},"NodeNames":[NaN]}}',
    f'{{"Pod":{POD},"Nodes":{{"items":[{{"metadata":{{"name":"x"}}}}]}},"NodeNames":null}}',
    # Broken heads before a good list.
    f'{{"Pod":{{"metadata":{{}}}},"NodeNames":{NAMES}}}',
    f'{{"Pod":{POD},,"NodeNames":{NAMES}}}',
    f'{{,"NodeNames":{NAMES}}}',
    f'{{"Pod":{POD}}},"NodeNames":{NAMES}}}',
    f'{{"Pod":{{"metadata":{{"name":"p","annotations":{{"a":"\\",\\"NodeNames\\":[]}}"}}}}}},'
    f'"NodeNames":{NAMES}}}',
    f'{{"Pod":{POD},"NodeNames":{NAMES}}}\n',
]


def outcome(read, body: bytes) -> ExtenderArgs | str:
    try:
        return read(body)
    except WireError as err:
        return f"WireError: {err}"


@pytest.mark.parametrize("body", [b.encode() for b in BODIES])
def test_reads_what_the_full_parse_reads(body):
    reader = ExtenderArgsReader()
    expected = outcome(lambda b: parse(ExtenderArgs, b), body)
    assert outcome(reader.read, body) == expected
    assert outcome(reader.read, body) == expected  # its list now known, if it was taken


@pytest.mark.parametrize("body", [b.encode() for b in BODIES])
def test_a_known_list_under_any_head_reads_as_the_full_parse(body):
    reader = ExtenderArgsReader()
    for known in BODIES[:4]:
        reader.read(known.encode())
    assert outcome(reader.read, body) == outcome(lambda b: parse(ExtenderArgs, b), body)


def test_a_list_seen_again_is_the_same_object():
    reader = ExtenderArgsReader()
    first = reader.read(BODIES[0].encode())
    other_pod = json.dumps(pod_json(pod("q", mem=2)), separators=(",", ":"))
    again = reader.read(f'{{"Pod":{other_pod},"Nodes":null,"NodeNames":{NAMES}}}'.encode())
    assert again.node_names is first.node_names
    assert again.pod.metadata.name == "q"


def test_it_remembers_a_bounded_number_of_lists():
    reader = ExtenderArgsReader(remembered=2)

    def read(names: list[str]) -> list[str] | None:
        body = json.dumps({"Pod": json.loads(POD), "NodeNames": names}).encode()
        return reader.read(body).node_names

    first = {name: read([name]) for name in "abc"}
    assert read(["c"]) is first["c"]
    again = read(["a"])
    assert again == ["a"] and again is not first["a"]  # forgotten, decoded again


def test_a_list_filter_expects_is_read_as_that_very_object():
    reader = ExtenderArgsReader()
    passed = [f"node-{i:03d}" for i in range(0, 50, 3)]
    reader.expect(passed, json.dumps(passed, separators=(",", ":")))
    body = f'{{"Pod":{POD},"Nodes":null,"NodeNames":{json.dumps(passed, separators=(",", ":"))}}}'
    assert reader.read(body.encode()).node_names is passed
    # Written another way, the same names are decoded again, and found to be that list.
    spaced = json.dumps({"Pod": json.loads(POD), "Nodes": None, "NodeNames": passed}).encode()
    read = reader.read(spaced)
    assert read.node_names is passed
    assert read == parse(ExtenderArgs, spaced)


def test_the_same_names_in_another_order_are_read_as_the_list_remembered():
    """kube-scheduler lists the nodes that pass its filters in the order its parallel
    workers finish: each pod's candidates are the same names in another order."""
    reader = ExtenderArgsReader()
    names = json.loads(NAMES)
    first = reader.read(BODIES[0].encode()).node_names
    shuffled = names[25:] + names[:25]

    def body(listed: list[str]) -> bytes:
        return f'{{"Pod":{POD},"Nodes":null,"NodeNames":{json.dumps(listed)}}}'.encode()

    assert reader.read(body(shuffled)).node_names is first
    # Not the same names: one left out, one replaced, one twice.
    for other in (names[1:], ["other", *names[1:]], [names[1], *names[1:]]):
        read = reader.read(body(other))
        assert read.node_names is not first and read == parse(ExtenderArgs, body(other))
    # A permuted body is not remembered (its order does not come again): the two
    # lists remembered beside it stay, and the first is still recognised.
    small = ExtenderArgsReader(remembered=2)
    first = small.read(BODIES[0].encode()).node_names
    kept = small.read(body(["x", "y"])).node_names
    for _ in range(3):
        assert small.read(body(shuffled)).node_names is first
    assert small.read(body(["x", "y"])).node_names is kept


def test_expecting_a_list_again_keeps_it_among_those_remembered():
    reader = ExtenderArgsReader(remembered=2)
    kept = ["a", "b"]
    reader.expect(kept, '["a","b"]')
    for other in (["c"], ["d"]):
        reader.expect(kept, '["a","b"]')  # the same list filter passed, asked again
        reader.expect(other, json.dumps(other))
    body = f'{{"Pod":{POD},"NodeNames":["a","b"]}}'.encode()
    assert reader.read(body).node_names is kept
    forgotten = f'{{"Pod":{POD},"NodeNames":["c"]}}'.encode()
    assert reader.read(forgotten).node_names == ["c"]


def test_a_list_read_in_other_orders_stays_remembered():
    reader = ExtenderArgsReader(remembered=2)
    names = json.loads(NAMES)
    first = reader.read(BODIES[0].encode()).node_names
    for i in range(1, 6):
        others = [f"other-{i}"]
        reader.read(f'{{"Pod":{POD},"NodeNames":{json.dumps(others)}}}'.encode())
        shuffled = names[i:] + names[:i]  # its bytes never seen: found by its names
        body = f'{{"Pod":{POD},"NodeNames":{json.dumps(shuffled)}}}'.encode()
        assert reader.read(body).node_names is first
