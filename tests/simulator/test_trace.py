"""Reading the openb CSVs into the core's nodes and requests, and refusing bad files."""

import pytest

from gpushare.labels import NodeMode
from gpushare.request import ContainerRole
from gpushare.simulator.trace import PodClass, TraceError, load, pod_rows
from tests.simulator.traces import NODES_CSV, PODS_CSV, tiny, write


def test_the_default_trace_has_the_pinned_size():
    trace = load(NODES_CSV, PODS_CSV)
    assert len(trace.nodes) == 1213 and trace.capacity == 6_212_000
    assert len(trace.pods) == 8152
    assert 0.97 < trace.requested / trace.capacity < 0.99  # "98% of capacity"
    assert [n.name for n in trace.nodes] == sorted(n.name for n in trace.nodes)


def test_nodes_become_milli_gpu_inventories_that_track_cpu(tmp_path):
    trace = tiny(tmp_path, [("n1", 16000, 65536, 2, "P100")], [("p", 1000, 1024, 1, 500, "")])
    inventory = trace.nodes[0].inventory()
    assert [(g.mem, g.core, g.model) for g in inventory.gpus] == [(1000, 1000, "P100")] * 2
    assert (inventory.cpu_milli, inventory.memory_mib) == (16000, 65536)
    assert inventory.mode is NodeMode.CORE_MEM
    assert inventory.max_pods_per_gpu >= 1000  # the Kubernetes limit does not bind here


def test_pods_become_slices_whole_gpus_or_cpu_only_requests(tmp_path):
    trace = tiny(
        tmp_path,
        [("n1", 16000, 65536, 8, "G2")],
        [
            ("share", 3152, 1024, 1, 810, ""),
            ("whole", 11300, 2048, 4, 1000, ""),
            ("cpu", 8000, 4096, 0, 0, ""),
            ("picky", 1000, 1024, 1, 300, "V100M16|V100M32"),
        ],
    )
    pods = {p.name: p for p in trace.pods}
    share = pods["share"].request()
    assert share.cpu_milli == 3152 and share.memory_mib == 1024
    (c,) = share.containers
    assert (c.gpus, c.mem, c.core, c.exclusive, c.role) == (1, 810, 810, False, ContainerRole.APP)
    (w,) = pods["whole"].request().containers
    assert (w.gpus, w.exclusive) == (4, True)
    assert pods["cpu"].request().containers == ()
    assert pods["picky"].request().gpu_spec == frozenset({"V100M16", "V100M32"})
    assert [pods[n].kind for n in ("share", "whole", "cpu")] == [
        PodClass.SHARING,
        PodClass.GPU4,
        PodClass.CPU,
    ]
    assert pods["whole"].gpu_total == 4000


def test_a_missing_column_is_named(tmp_path):
    nodes, pods = write(tmp_path, [("n1", 1, 1, 1, "T4")], [("p", 1, 1, 1, 10, "")])
    nodes.write_text("sn,cpu_milli,gpu,model\nn1,1,1,T4\n")
    with pytest.raises(TraceError, match=r"missing column.*memory_mib"):
        load(nodes, pods)


def test_a_bad_number_is_named_with_its_row(tmp_path):
    nodes, pods = write(tmp_path, [("n1", 1, 1, 1, "T4")], [("p", "lots", 1, 1, 10, "")])
    with pytest.raises(TraceError, match=r"pods.csv:2: column cpu_milli must be a whole number"):
        load(nodes, pods)


def test_a_gpu_share_out_of_range_is_refused(tmp_path):
    nodes, pods = write(tmp_path, [("n1", 1, 1, 1, "T4")], [("p", 1, 1, 1, 1500, "")])
    with pytest.raises(TraceError, match=r"gpu_milli must be in 1\.\.1000"):
        load(nodes, pods)


def test_a_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read trace file"):
        load(tmp_path / "nope.csv", tmp_path / "nope2.csv")


@pytest.mark.parametrize(("row", "size"), [("n1,1,1,1", "fewer"), ("n1,1,1,1,T4,extra", "more")])
def test_a_row_of_the_wrong_length_is_named_with_its_line(tmp_path, row, size):
    nodes, pods = write(tmp_path, [("n1", 1, 1, 1, "T4")], [("p", 1, 1, 1, 10, "")])
    nodes.write_text(f"sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,1,T4\n{row}\n")
    with pytest.raises(TraceError, match=rf"nodes.csv:3: the row has {size} fields"):
        load(nodes, pods)


def test_a_file_that_is_not_utf8_text_is_a_trace_error(tmp_path):
    nodes, pods = write(tmp_path, [("n1", 1, 1, 1, "T4")], [("p", 1, 1, 1, 10, "")])
    pods.write_bytes(b"\xff\xfe\x00\x01binary")
    with pytest.raises(TraceError, match=r"pods\.csv: is not UTF-8 text"):
        load(nodes, pods)


@pytest.mark.parametrize(
    ("node", "pod", "where", "column"),
    [
        (("n1", "x", 1, 1, "T4"), ("p", 1, 1, 1, 10, ""), "nodes.csv:2", "cpu_milli"),
        (("n1", 1, "x", 1, "T4"), ("p", 1, 1, 1, 10, ""), "nodes.csv:2", "memory_mib"),
        (("n1", 1, 1, "x", "T4"), ("p", 1, 1, 1, 10, ""), "nodes.csv:2", "gpu"),
        (("n1", 1, 1, 1, "T4"), ("p", 1, 1, "x", 10, ""), "pods.csv:2", "num_gpu"),
        (("n1", 1, 1, 1, "T4"), ("p", 1, 1, 1, "x", ""), "pods.csv:2", "gpu_milli"),
        (("n1", 1, 1, 1, "T4"), ("p", 1, "x", 1, 10, ""), "pods.csv:2", "memory_mib"),
    ],
)
def test_every_number_column_names_its_file_line_and_column(tmp_path, node, pod, where, column):
    nodes, pods = write(tmp_path, [node], [pod])
    with pytest.raises(TraceError) as refused:
        load(nodes, pods)
    assert str(refused.value) == (
        f"{tmp_path}/{where}: column {column} must be a whole number, got 'x'"
    )


def test_an_empty_number_field_is_named_as_empty(tmp_path):
    nodes, pods = write(tmp_path, [("n1", "", 1, 1, "T4")], [("p", 1, 1, 1, 10, "")])
    with pytest.raises(TraceError, match=r"column cpu_milli must be a whole number, got ''$"):
        load(nodes, pods)


@pytest.mark.parametrize(
    ("node", "pod", "message"),
    [
        (("n1", -1, 1, 1, "T4"), ("p", 1, 1, 1, 10, ""), "nodes.csv:2: column cpu_milli"),
        (("n1", 1, 1, 1, "T4"), ("p", 1, 1, -2, 10, ""), "pods.csv:2: column num_gpu"),
    ],
)
def test_a_negative_number_is_refused_with_its_place(tmp_path, node, pod, message):
    nodes, pods = write(tmp_path, [node], [pod])
    with pytest.raises(TraceError) as refused:
        load(nodes, pods)
    assert str(refused.value).startswith(f"{tmp_path}/{message} must not be negative, got -")


def test_files_without_nodes_or_without_pods_are_refused_by_name(tmp_path):
    nodes, pods = write(tmp_path, [], [("p", 1, 1, 1, 10, "")])
    with pytest.raises(TraceError) as refused:
        load(nodes, pods)
    assert str(refused.value) == f"{nodes}: no nodes"
    nodes, pods = write(tmp_path, [("n1", 1, 1, 1, "T4")], [])
    with pytest.raises(TraceError) as refused:
        load(nodes, pods)
    assert str(refused.value) == f"{pods}: no pods"


def test_a_missing_column_message_lists_what_is_missing_and_what_the_format_needs(tmp_path):
    nodes, pods = write(tmp_path, [("n1", 1, 1, 1, "T4")], [("p", 1, 1, 1, 10, "")])
    nodes.write_text("sn,cpu_milli,model\nn1,1,T4\n")
    with pytest.raises(TraceError) as refused:
        load(nodes, pods)
    assert str(refused.value) == (
        f"{nodes}: missing column(s) memory_mib, gpu; "
        "the openb format needs sn, cpu_milli, memory_mib, gpu, model"
    )


@pytest.mark.parametrize(("milli", "fits"), [(0, False), (1, True), (1000, True), (1001, False)])
def test_a_gpu_pods_share_must_be_between_1_and_1000_milli(tmp_path, milli, fits):
    nodes, pods = write(tmp_path, [("n1", 1, 1, 1, "T4")], [("p", 1, 1, 1, milli, "")])
    if fits:
        assert load(nodes, pods).pods[0].gpu_milli == milli
    else:
        with pytest.raises(
            TraceError, match=rf"pods.csv:2: gpu_milli must be in 1\.\.1000 .*got {milli}"
        ):
            load(nodes, pods)


def test_a_cpu_only_pod_asks_for_no_gpu_whatever_its_gpu_milli_says(tmp_path):
    trace = tiny(tmp_path, [("n1", 1, 1, 1, "T4")], [("cpu", 1, 1, 0, 500, "")])
    assert (trace.pods[0].gpu_milli, trace.pods[0].gpu_total) == (0, 0)


def test_a_whole_gpu_pod_is_one_exclusive_app_container_named_main(tmp_path):
    trace = tiny(
        tmp_path, [("n1", 1, 1, 8, "G2")], [("w", 1, 1, 2, 1000, ""), ("s", 1, 1, 1, 300, "")]
    )
    whole, share = (
        p.request().containers[0] for p in sorted(trace.pods, key=lambda p: p.name != "w")
    )
    assert (whole.name, whole.index, whole.gpus, whole.mem, whole.exclusive) == (
        "main",
        0,
        2,
        0,
        True,
    )
    assert (share.name, share.index) == ("main", 0)


def test_a_nodes_gpus_are_anonymous_binpacked_and_keep_an_empty_model(tmp_path):
    trace = tiny(tmp_path, [("n1", 1, 1, 2, "")], [("p", 1, 1, 1, 10, "")])
    inventory = trace.nodes[0].inventory()
    assert [(g.index, g.uuid, g.model) for g in inventory.gpus] == [(0, "", ""), (1, "", "")]


def test_a_trace_says_which_files_it_came_from(tmp_path):
    trace = tiny(tmp_path, [("n1", 1, 1, 1, "T4")], [("p", 1, 1, 1, 10, "")])
    assert trace.source == "nodes.csv + pods.csv"


def test_a_pod_list_without_gpu_spec_or_the_other_optional_columns_reads(tmp_path):
    # Some lists of the public trace family have only these five columns.
    nodes, pods = write(tmp_path, [("n1", 8000, 8192, 2, "T4")], [])
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,1,500\n")
    [pod] = load(nodes, pods).pods
    assert (pod.num_gpu, pod.gpu_milli, pod.gpu_spec) == (1, 500, None)
    assert pod.request().gpu_spec is None  # any GPU model


@pytest.mark.parametrize("column", ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"])
def test_a_required_pod_column_is_still_refused_by_name(tmp_path, column):
    nodes, pods = write(tmp_path, [("n1", 8000, 8192, 2, "T4")], [])
    header = [c for c in ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli") if c != column]
    pods.write_text(",".join(header) + "\n" + ",".join("1" for _ in header) + "\n")
    with pytest.raises(TraceError) as refused:
        load(nodes, pods)
    assert str(refused.value).startswith(f"{pods}: missing column(s) {column}; ")


def test_pod_rows_read_back_as_the_same_pods(tmp_path):
    trace = tiny(
        tmp_path,
        [("n1", 8000, 8192, 2, "T4")],
        [
            ("a", 1000, 1024, 1, 500, "T4|P100"),
            ("b", 2000, 2048, 0, 0, ""),
            ("c", 1, 2, 2, 1000, ""),
        ],
    )
    written = tmp_path / "again.csv"
    written.write_text(pod_rows(trace.pods))
    assert load(tmp_path / "nodes.csv", written).pods == trace.pods
