"""The control-tree codec: what the agent encodes, cgpu-smi decodes to the same values."""

from dataclasses import replace

import pytest

from gpushare.isolation.backends.port import GIB
from gpushare.isolation.control import ControlTree, read_files
from gpushare.isolation.policy import Policy
from gpushare.isolation.treecodec import (
    ABSENT,
    ContainerEntry,
    GpuEntry,
    ProcessMemory,
    TreeContent,
    control_write,
    decode,
    encode,
    is_setting,
)


def container(id: str) -> ContainerEntry:
    return ContainerEntry(
        id=id,
        pod=f"default/{id[:4]}",
        name="main",
        memsize=4 * GIB,
        processes=(ProcessMemory(4000, GIB), ProcessMemory(4001, 2 * GIB)),
        weight=2,
        highprio=True,
        util=33.3,
        limit=66.7,
        violations=3,
    )


def tree() -> TreeContent:
    """Every kind of value the format carries; percents with one decimal, as written."""
    gpu0 = GpuEntry(
        index=0,
        uuid="GPU-1",
        model="Tesla-T4",
        mem_bytes=15 * GIB,
        policy=Policy.WEIGHTED,
        max_inst=16,
        prio_ratio=50,
        free_weight=12,
        major=195,
        util=99.9,
        containers=(
            container("a" * 64),
            replace(
                container("b" * 64), memsize=0, processes=(), highprio=False, util=0.0, limit=None
            ),
        ),
    )
    gpu1 = GpuEntry(
        index=1,
        uuid="GPU-2",
        model="A100",
        mem_bytes=80 * GIB,
        policy=Policy.NATIVE,
        max_inst=25,
        prio_ratio=99,
        free_weight=25,
        major=195,
        util=0.0,
        containers=(),
    )
    return TreeContent("gpushare-isolation 9.9", 0, (gpu0, gpu1))


def test_decode_gives_back_what_encode_wrote():
    assert decode(encode(tree())) == tree()


def test_the_round_trip_holds_through_the_files_on_disk(tmp_path):
    ControlTree(tmp_path).publish(tree())
    assert decode(read_files(tmp_path)) == tree()


def test_percents_keep_one_decimal():
    gpu = replace(tree().gpus[1], util=33.349)
    assert decode(encode(TreeContent("v", 0, (gpu,)))).gpus[0].util == 33.3


def test_the_files_are_cgpus_and_gpushares_own():
    files = encode(tree())
    a = "a" * 64
    assert files["0/policy"] == "2\n"
    assert files["0/mem_total"] == f"{15 * GIB}\n"
    assert files[f"0/{a}/highprio"] == "1\n"
    assert (
        files[f"0/{a}/meminfo"] == f"Free: {GIB}\nPID: 4000 Mem: {GIB}\nPID: 4001 Mem: {2 * GIB}\n"
    )
    assert files[f"0/{'b' * 64}/limit"] == "none\n"
    assert files[f"0/{'b' * 64}/meminfo"] == "Free: 0\n"
    assert files["inst_ctl"] == f"0 {a}\n0 {'b' * 64}\n"


def test_a_plain_cgpu_tree_decodes_with_gpushares_files_absent():
    gpushare_only = {
        "uuid",
        "model",
        "mem_total",
        "util",
        "pod",
        "container",
        "limit",
        "violations",
    }
    files = {
        path: text
        for path, text in encode(tree()).items()
        if path.rpartition("/")[2] not in gpushare_only
    }
    gpu = decode(files).gpus[0]
    assert (gpu.uuid, gpu.model, gpu.mem_bytes, gpu.util) == (ABSENT, ABSENT, 0, None)
    first = gpu.containers[0]
    assert (first.pod, first.name, first.util, first.limit, first.violations) == (
        ABSENT,
        ABSENT,
        None,
        None,
        0,
    )
    assert (first.weight, first.highprio, first.mem_used, first.mem_free) == (2, True, 3 * GIB, GIB)


@pytest.mark.parametrize(
    ("path", "text"),
    [
        (f"0/{'a' * 64}/weight", "heavy\n"),
        (f"0/{'a' * 64}/highprio", "2\n"),
        (f"0/{'a' * 64}/meminfo", None),
    ],
)
def test_a_container_whose_files_do_not_parse_is_left_out(path, text):
    files = encode(tree())
    if text is None:
        del files[path]
    else:
        files[path] = text
    [kept] = decode(files).gpus[0].containers
    assert kept.id == "b" * 64


def test_a_gpu_with_a_policy_being_written_is_left_out():
    files = {**encode(tree()), "0/policy": "9\n"}
    assert [g.index for g in decode(files).gpus] == [1]


def test_a_directory_without_a_version_is_not_a_tree():
    with pytest.raises(ValueError, match="not a control tree"):
        decode({"0/policy": "2\n"})


def test_which_files_take_writes():
    a = "a" * 64
    assert all(is_setting(p) for p in ["0/policy", "0/max_inst", "0/prio_ratio"])
    assert all(is_setting(p) for p in [f"0/{a}/weight", f"0/{a}/highprio"])
    assert not any(is_setting(p) for p in ["version", "0/free_weight", f"0/{a}/memsize"])


def test_a_write_names_its_gpu_container_and_file():
    a = "a" * 64
    write = control_write(f"1/{a}/weight", "3\n")
    assert (write.gpu, write.container, write.name, write.raw) == (1, a, "weight", "3\n")
    top = control_write("version", "x")
    assert (top.gpu, top.container, top.name) == (None, None, "version")
