"""The grant file: what the node decided for one container, read back exactly or refused."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare import grant as codec
from gpushare.grant import Grant, GrantError

GIB = 1 << 30


def a_grant(**changes: object) -> Grant:
    fields: dict[str, object] = dict(
        id="0123456789abcdef0123456789abcdef",
        pod_uid="2b4c6d8e-0000-4000-8000-000000000001",
        namespace="team-a",
        pod="trainer",
        container="main",
        indices=(0, 2),
        uuids=("GPU-aaaa", "GPU-bbbb"),
        mem_bytes=(4 * GIB, 2 * GIB),
        core_percent=(30, 0),
        dev_mem_gib=(16, 16),
        weight=2,
        high_priority=True,
        isolation_disabled=False,
        region="/run/gpushare/cuda-region",
    )
    fields.update(changes)
    return Grant(**fields)  # type: ignore[arg-type]


def test_a_grant_reads_back_as_written():
    grant = a_grant()
    data = codec.encode(grant)
    assert data.startswith(b"gpushare-grant=1\nid=0123456789abcdef0123456789abcdef\n")
    assert b"mem-bytes=4294967296,2147483648\n" in data
    assert codec.decode(data) == grant


def test_the_limits_the_agent_enforces_come_from_the_grant():
    limits = a_grant(mem_bytes=(4 * GIB, GIB + 1)).limits()
    assert limits.pod == "team-a/trainer"
    assert limits.container == "main"
    assert limits.gpu_indices == (0, 2)
    assert limits.gpu_uuids == ("GPU-aaaa", "GPU-bbbb")
    assert limits.mem_gib == (4, 2)  # a cap is never rounded down to less than granted
    assert limits.core_percent == (30, 0)
    assert (limits.weight, limits.high_priority, limits.isolation_disabled) == (2, True, False)


_names = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=",="))


@st.composite
def grants(draw: st.DrawFn) -> Grant:
    count = draw(st.integers(1, 16))
    ints = st.lists(st.integers(0, 63), min_size=count, max_size=count)
    return Grant(
        id=draw(st.from_regex(r"[0-9a-f]{32}", fullmatch=True)),
        pod_uid=draw(_names),
        namespace=draw(_names),
        pod=draw(_names),
        container=draw(_names),
        indices=tuple(draw(ints)),
        uuids=tuple(draw(st.lists(_names.filter(bool), min_size=count, max_size=count)))
        if draw(st.booleans())
        else (),
        mem_bytes=tuple(draw(st.lists(st.integers(1, 1 << 50), min_size=count, max_size=count))),
        core_percent=tuple(draw(st.lists(st.integers(0, 100), min_size=count, max_size=count))),
        dev_mem_gib=tuple(draw(ints)),
        weight=draw(st.integers(1, 100)),
        high_priority=draw(st.booleans()),
        isolation_disabled=draw(st.booleans()),
        region="/" + draw(_names),
    )


@given(grants())
def test_every_grant_round_trips(grant: Grant):
    assert codec.decode(codec.encode(grant)) == grant


@given(grants(), st.data())
def test_a_grant_cut_short_is_refused(grant: Grant, data: st.DataObject):
    whole = codec.encode(grant)
    cut = data.draw(st.integers(0, len(whole) - 1))
    with pytest.raises(GrantError):
        codec.decode(whole[:cut])


@pytest.mark.parametrize(
    ("replace", "by", "named"),
    [
        (b"gpushare-grant=1", b"gpushare-grant=2", "first line"),
        (b"mem-bytes=4294967296,2147483648", b"mem-bytes=0,2147483648", "memory cap"),
        (b"mem-bytes=4294967296,2147483648", b"mem-bytes=-1,2147483648", "mem-bytes"),
        (b"mem-bytes=4294967296,2147483648", b"mem-bytes=1.5,2", "mem-bytes"),
        (b"mem-bytes=4294967296,2147483648", b"mem-bytes=04294967296,2", "mem-bytes"),
        (b"mem-bytes=4294967296,2147483648", b"mem-bytes= 4294967296,2", "mem-bytes"),
        (b"mem-bytes=4294967296,2147483648", b"mem-bytes=1125899906842625,1", "memory cap"),
        (b"mem-bytes=4294967296,2147483648", b"mem-bytes=4294967296", "1 values for 2"),
        (b"mem-bytes=4294967296,2147483648\n", b"", "mem-bytes missing"),
        (b"region=/run/gpushare/cuda-region", b"region=cuda-region", "absolute"),
        (b"core-percent=30,0", b"core-percent=300,0", "percentage"),
        (b"uuids=GPU-aaaa,GPU-bbbb", b"uuids=GPU-aaaa", "uuids has 1"),
        (b"id=0123456789abcdef0123456789abcdef", b"id=../../etc", "id"),
        (b"weight=2", b"weight=0", "weight"),
        (b"high-priority=1", b"high-priority=yes", "high-priority"),
        (b"pod=trainer\n", b"pod=trainer\nmem-bytes=1,1\n", "twice"),
        (b"pod=trainer\n", b"pod=tr\xc3\xa4iner\n", "ASCII"),
        (b"pod=trainer\n", b"pod trainer\n", "key=value"),
    ],
)
def test_a_damaged_grant_is_refused_naming_what_is_wrong(replace: bytes, by: bytes, named: str):
    data = codec.encode(a_grant())
    assert replace in data
    with pytest.raises(GrantError, match=named):
        codec.decode(data.replace(replace, by))


def test_keys_a_newer_plugin_adds_are_skipped():
    data = codec.encode(a_grant()) + b"mig-profile=1g.10gb\n"
    assert codec.decode(data) == a_grant()


def test_a_grant_over_its_size_or_line_length_is_refused():
    with pytest.raises(GrantError, match="at most 4096"):
        codec.decode(codec.encode(a_grant()) + b"x=" + b"y" * 5000 + b"\n")
    with pytest.raises(GrantError, match="over 1024"):
        codec.decode(codec.encode(a_grant()) + b"x=" + b"y" * 1100 + b"\n")


def test_a_grant_is_checked_when_made_too():
    with pytest.raises(GrantError, match="1 to 16 GPUs"):
        a_grant(indices=(), uuids=(), mem_bytes=(), core_percent=(), dev_mem_gib=())
    with pytest.raises(GrantError, match="comma"):
        a_grant(pod="a,b")
    with pytest.raises(GrantError, match="negative"):
        a_grant(indices=(0, -1))
    assert dataclasses.replace(a_grant(), uuids=()).uuids == ()
