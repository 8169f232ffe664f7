"""A record we cannot trust is refused, never read as another allocation (issue 39):
our record carries a check of its own text; one without it (written before there were
checks) must agree with ACK's keys beside it; values out of range are refused; and
`read` says what to charge for a pod whose record is damaged."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare import annotation
from gpushare.allocation import ContainerAllocation, GpuSlice, PodAllocation
from gpushare.errors import AnnotationError
from gpushare.request import ContainerRole
from tests.builders import T0, pod

ACK_IDX = "ALIYUN_COM_GPU_MEM_IDX"


def allocation(mem: int = 8, index: int = 0, core: int = 0) -> PodAllocation:
    gpu = GpuSlice(index=index, uuid=f"GPU-{index}", mem=mem, core=core, gpu_mem=16)
    main = ContainerAllocation(name="main", role=ContainerRole.APP, index=0, gpus=(gpu,))
    return PodAllocation(node="n", bound_at=T0, containers=(main,))


def on_pod(annotations: dict[str, str]):
    return pod("p", mem=8, node="n", annotations=annotations)


def unchecked(record: str, **changes: object) -> str:
    """The record without its check (as gpushare wrote it before), its slice changed."""
    document = json.loads(record)
    del document[annotation.CHECK]
    document["containers"][0]["gpus"][0].update(changes)
    return json.dumps(document)


def test_what_we_write_ends_with_a_check_of_everything_before_it():
    record = annotation.encode(allocation())[annotation.ALLOCATION]
    assert json.loads(record)[annotation.CHECK] == record[-18:-2]
    assert record.endswith(f',"{annotation.CHECK}":"{record[-18:-2]}"}}')
    marked = annotation.assigned_annotations(allocation())[annotation.ALLOCATION]
    assert annotation.decode(on_pod({annotation.ALLOCATION: marked})) == allocation()


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.replace('"memGiB":8', '"memGiB":9'),
        lambda r: r.replace('"memGiB":8', '"memGiB":0'),
        lambda r: r.replace('"check":"', '"check":"0'),
        lambda r: r[:-3] + "x" + r[-2:],
        lambda r: r.replace('"corePercent"', '"corePercenx"'),
    ],
)
def test_a_record_changed_after_it_was_written_fails_its_check(change):
    record = annotation.encode(allocation())[annotation.ALLOCATION]
    changed = change(record)
    assert changed != record and json.loads(changed)
    with pytest.raises(AnnotationError, match="fails its check"):
        annotation.decode(on_pod({annotation.ALLOCATION: changed}))


def test_a_check_that_is_not_text_fails():
    body = allocation().model_dump_json(by_alias=True)
    with pytest.raises(AnnotationError, match="fails its check"):
        annotation.decode(on_pod({annotation.ALLOCATION: body[:-1] + ',"check":7}'}))


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"memGiB": -8}, "memGiB"),
        ({"index": -1}, "index"),
        ({"corePercent": -5}, "corePercent"),
        ({"gpuMemGiB": -16}, "gpuMemGiB"),
        ({"corePercent": 500}, "500 percent compute, more than a whole GPU"),
        ({"corePercent": 101}, "101 percent compute"),
        ({"memGiB": 17}, "holds 17 GiB, more than the GPU's 16 GiB"),
    ],
)
def test_values_out_of_range_are_refused(changes, problem):
    record = unchecked(annotation.encode(allocation())[annotation.ALLOCATION], **changes)
    with pytest.raises(AnnotationError, match=problem):
        annotation.decode(on_pod({annotation.ALLOCATION: record}))


@pytest.mark.parametrize(
    "changes",
    [{"memGiB": 0}, {"index": 0}, {"corePercent": 0}, {"corePercent": 100}, {"memGiB": 16}],
)
def test_values_at_the_edge_of_their_range_are_read(changes):
    record = unchecked(annotation.encode(allocation())[annotation.ALLOCATION], **changes)
    assert annotation.decode(on_pod({annotation.ALLOCATION: record})) is not None


def test_memory_of_a_gpu_not_written_down_is_not_a_limit():
    record = unchecked(annotation.encode(allocation())[annotation.ALLOCATION], gpuMemGiB=0)
    decoded = annotation.decode(on_pod({annotation.ALLOCATION: record}))
    assert decoded is not None and decoded.containers[0].gpus[0].mem == 8


def test_a_record_without_a_check_is_read_where_acks_keys_agree():
    keys = annotation.encode(allocation())
    keys[annotation.ALLOCATION] = unchecked(keys[annotation.ALLOCATION])
    keys[annotation.ACK_V2_ALLOCATION] = '{"0": {"0": 8}}'  # other spacing, same JSON
    assert annotation.decode(on_pod(keys)) == allocation()
    alone = {annotation.ALLOCATION: keys[annotation.ALLOCATION]}
    assert annotation.decode(on_pod(alone)) == allocation()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (ACK_IDX, "1"),
        ("ALIYUN_COM_GPU_MEM_POD", "9"),
        ("scheduler.framework.gpushare.allocation", '{"0":{"0":9}}'),
        ("scheduler.framework.gpushare.allocation", "{not json"),
    ],
)
def test_a_record_without_a_check_that_acks_keys_contradict_is_refused(key, value):
    keys = annotation.encode(allocation())
    keys[annotation.ALLOCATION] = unchecked(keys[annotation.ALLOCATION], memGiB=8)
    keys[key] = value
    with pytest.raises(AnnotationError, match=f"says {key} should be .*, but it is"):
        annotation.decode(on_pod(keys))


def test_acks_keys_out_of_range_are_refused():
    bad = on_pod({annotation.ACK_V2_ALLOCATION: '{"0":{"0":-8}}'})
    with pytest.raises(AnnotationError, match="ACK allocation keys of pod default/p"):
        annotation.decode(bad)
    core = pod("p", mem=8, core=500, node="n", annotations={ACK_IDX: "0"})
    with pytest.raises(AnnotationError, match="500 percent compute"):
        annotation.decode(core)


# ----- read: what to charge


def test_a_sound_record_is_read_with_no_problem():
    assert annotation.read(on_pod(annotation.encode(allocation()))) == annotation.Reading(
        allocation()
    )
    assert annotation.read(pod("p", mem=1)) == annotation.Reading(None)


def test_a_damaged_record_is_charged_as_acks_keys_say():
    keys = annotation.encode(allocation(mem=8, index=0))
    keys[annotation.ALLOCATION] = "{oops"
    reading = annotation.read(on_pod(keys))
    assert reading.allocation is not None and not reading.allocation.unknown
    assert reading.allocation.charges() == {0: (8, 0)}
    assert reading.problem is not None
    assert "not a JSON object" in reading.problem and "charged as ACK's keys say" in reading.problem


def test_a_damaged_record_with_damaged_ack_keys_is_an_unknown_allocation_on_its_node():
    keys = annotation.encode(allocation())
    keys.update({annotation.ALLOCATION: "{oops", annotation.ACK_V2_ALLOCATION: "{"})
    reading = annotation.read(on_pod(keys))
    assert reading.allocation == PodAllocation.unknown_on("n")
    assert reading.allocation is not None and reading.allocation.unknown
    assert reading.problem is not None and "ACK allocation keys" in reading.problem
    assert "node n takes no new GPU pod" in reading.problem


def test_a_damaged_record_alone_is_an_unknown_allocation_on_its_node():
    reading = annotation.read(on_pod({annotation.ALLOCATION: "{oops"}))
    assert reading.allocation == PodAllocation.unknown_on("n")


def test_a_damaged_record_on_a_pod_not_bound_is_a_problem_and_no_allocation():
    reading = annotation.read(pod("p", mem=1, annotations={annotation.ALLOCATION: "{oops"}))
    assert reading.allocation is None and reading.problem is not None


def test_acks_own_records_unreadable_are_not_read_again():
    reading = annotation.read(on_pod({ACK_IDX: "zero"}))
    assert reading.allocation == PodAllocation.unknown_on("n")
    assert reading.problem is not None and reading.problem.count("ACK allocation keys") == 1


# ----- properties


@st.composite
def allocations(draw) -> PodAllocation:
    containers = []
    for index in range(draw(st.integers(1, 3))):
        gpus = tuple(
            GpuSlice(
                index=gpu,
                uuid=f"GPU-{gpu}",
                mem=draw(st.integers(0, 80)),
                core=draw(st.sampled_from([0, 5, 50, 100])),
                gpu_mem=80,
            )
            for gpu in sorted(draw(st.sets(st.integers(0, 7), min_size=1, max_size=3)))
        )
        containers.append(
            ContainerAllocation(
                name=draw(st.sampled_from(["main", "side", "init", "a-b"])) + str(index),
                role=draw(st.sampled_from(list(ContainerRole))),
                index=index,
                gpus=gpus,
                exclusive=draw(st.booleans()),
                assigned=draw(st.booleans()),
            )
        )
    seconds = draw(st.integers(0, 10**9))
    return PodAllocation(
        node=draw(st.sampled_from(["n", "node-1", "gpu.example.com"])),
        bound_at=datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds),
        containers=tuple(containers),
    )


@given(allocations())
def test_encode_then_decode_round_trips(written):
    assert annotation.decode(on_pod(annotation.encode(written))) == written


_PRINTABLE = st.characters(min_codepoint=32, max_codepoint=126)


@st.composite
def corruptions(draw, record: str) -> str:
    """One change to the record: a character changed, deleted or inserted, or the
    record cut short."""
    at = draw(st.integers(0, len(record) - 1))
    kind = draw(st.sampled_from(["change", "delete", "insert", "truncate"]))
    if kind == "change":
        return record[:at] + draw(_PRINTABLE.filter(lambda c: c != record[at])) + record[at + 1 :]
    if kind == "delete":
        return record[:at] + record[at + 1 :]
    if kind == "insert":
        return record[:at] + draw(_PRINTABLE) + record[at:]
    return record[:at]


@given(st.data(), allocations())
def test_a_corrupted_record_is_read_as_written_or_refused_never_as_another(data, written):
    keys = annotation.encode(written)
    keys[annotation.ALLOCATION] = data.draw(corruptions(keys[annotation.ALLOCATION]))
    try:
        decoded = annotation.decode(on_pod(keys))
    except AnnotationError:
        return
    assert decoded == written
