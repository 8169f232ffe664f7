"""The agent holds a container to its grant (what the node decided, found by the grant in
its processes' mounts), not to what any of its processes' environments say."""

import dataclasses
import logging
from pathlib import Path

from gpushare import environment
from gpushare import grant as grants
from gpushare.environment import ContainerLimits
from gpushare.grant import Grant
from gpushare.isolation.backends.port import GIB, GpuProcess
from gpushare.isolation.backends.procfs import ProcessTable, parse_grant_mount
from gpushare.isolation.grants import RECHECK_S, RETRY_S, GrantBook
from gpushare.isolation.pacing import RegionPacer
from gpushare.isolation.workload import group_containers
from tests.isolation.regions import make_region, slot_holder

GRANT_ID = "0123456789abcdef0123456789abcdef"
CONTAINER_ID = "c" * 64


def a_grant(grant_id: str = GRANT_ID, mem_gib: int = 1, core: int = 30) -> Grant:
    limits = ContainerLimits(
        pod="ml/granted",
        container="main",
        gpu_uuids=("GPU-0",),
        gpu_indices=(0,),
        mem_gib=(mem_gib,),
        dev_mem_gib=(16,),
        core_percent=(core,),
    )
    return grants.grant_for(grant_id, "uid-1", limits, "/run/gpushare/cuda-region")


def write(directory: Path, grant: Grant) -> Path:
    folder = directory / "grants" / grant.id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "grant").write_bytes(grants.encode(grant))
    return folder / "grant"


def mountinfo(root: str, mount_point: str = environment.GRANT_IN_CONTAINER) -> str:
    return (
        "22 1 0:21 / / rw,relatime - overlay overlay rw\n"
        f"31 22 8:1 {root} {mount_point} ro,relatime - ext4 /dev/sda1 rw\n"
        "32 22 0:5 / /dev rw - tmpfs tmpfs rw\n"
    )


def test_the_grant_of_a_process_is_read_from_its_mounts():
    root = f"/var/lib/gpushare/interposer/grants/{GRANT_ID}/grant"
    assert parse_grant_mount(mountinfo(root)) == GRANT_ID
    # mountinfo escapes spaces in paths as octal
    escaped = f"/var/lib/my\\040node/grants/{GRANT_ID}/grant"
    assert parse_grant_mount(mountinfo(escaped)) == GRANT_ID


def test_only_the_grant_mount_point_and_a_grant_source_count():
    root = f"/var/lib/gpushare/interposer/grants/{GRANT_ID}/grant"
    assert parse_grant_mount(mountinfo(root, mount_point="/etc/other")) == ""
    assert parse_grant_mount(mountinfo("/home/tenant/grant")) == ""
    assert parse_grant_mount(mountinfo(f"/x/grants/{GRANT_ID[:-1]}/grant")) == ""
    assert parse_grant_mount("") == ""


def test_the_process_table_reads_a_grant_once_per_process(tmp_path):
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    info = proc / "7" / "mountinfo"
    info.write_text(mountinfo(f"/n/grants/{GRANT_ID}/grant"))
    table = ProcessTable(proc)
    assert table.grant(7) == GRANT_ID
    info.write_text(mountinfo("/elsewhere"))
    assert table.grant(7) == GRANT_ID  # a process's mounts do not change under it
    table.forget(set())
    assert table.grant(7) == ""
    assert table.grant(8) == ""  # gone


def test_the_book_reads_a_grant_once_and_retries_one_it_could_not_read(tmp_path, caplog):
    book = GrantBook(tmp_path)
    assert book.get(GRANT_ID, now=0.0) is None
    write(tmp_path, a_grant())
    assert book.get(GRANT_ID, now=1.0) is None  # not asked again before RETRY_S
    assert book.get(GRANT_ID, now=RETRY_S + 0.5) == a_grant()
    (tmp_path / "grants" / GRANT_ID / "grant").unlink()
    assert book.get(GRANT_ID, now=RETRY_S + 1) == a_grant()  # kept: grants never change
    assert caplog.text.count("cannot be read") == 1
    assert book.region_path(GRANT_ID) == tmp_path / "grants" / GRANT_ID / "region" / "cuda-region"


def test_the_book_refuses_a_grant_filed_under_another_id_or_a_path(tmp_path, caplog):
    other = "f" * 32
    path = write(tmp_path, a_grant())
    (tmp_path / "grants" / other).mkdir()
    (tmp_path / "grants" / other / "grant").write_bytes(path.read_bytes())
    book = GrantBook(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert book.get(other, now=0.0) is None
    assert f"it says it is grant {GRANT_ID}" in caplog.text
    assert book.get("../../etc", now=0.0) is None


def process(pid: int, mem_gib: float, environ: dict[str, str], grant_id: str = "") -> GpuProcess:
    return GpuProcess(
        pid, 0, int(mem_gib * GIB), 10.0, CONTAINER_ID, "uid-1", environ, grant_id=grant_id
    )


def contract_env(cap_gib: int) -> dict[str, str]:
    return {
        environment.MEM_CONTAINER: str(cap_gib),
        environment.MEM_IDX: "0",
        environment.POD: "ml/granted",
        environment.CONTAINER: "main",
    }


def test_every_process_of_a_granted_container_is_held_to_the_grant():
    book = {GRANT_ID: a_grant(mem_gib=1, core=30)}
    members = [
        process(1, 0.5, contract_env(1), GRANT_ID),
        process(2, 2.0, {}, GRANT_ID),  # a child started with an empty environment
        process(3, 0.5, contract_env(1000), GRANT_ID),  # one that gave itself a cap
    ]

    containers, unreadable = group_containers(members, grants=book.get)

    [container] = containers.values()
    assert unreadable == []
    assert container.granted and container.grant_id == GRANT_ID
    assert container.cap_bytes(0) == GIB
    assert container.core_percent(0) == 30
    assert container.mem_used(0) == 3 * GIB
    assert [p.pid for p in container.processes] == [1, 2, 3]


def test_a_forged_environment_first_in_line_does_not_choose_the_cap():
    book = {GRANT_ID: a_grant(mem_gib=1)}
    forged_first = [process(3, 0.5, contract_env(1000), GRANT_ID), process(1, 0.5, {}, GRANT_ID)]
    [container] = group_containers(forged_first, grants=book.get)[0].values()
    assert container.cap_bytes(0) == GIB


def test_without_a_readable_grant_the_environment_of_the_contract_holds():
    members = [process(2, 2.0, {}, GRANT_ID), process(1, 0.5, contract_env(4), GRANT_ID)]
    [container] = group_containers(members, grants=lambda _id: None)[0].values()
    assert not container.granted and container.grant_id == GRANT_ID
    assert container.cap_bytes(0) == 4 * GIB


def test_a_known_container_keeps_its_limits_while_its_grant_is_the_same():
    book = {GRANT_ID: a_grant(mem_gib=1)}
    first, _ = group_containers([process(1, 0.5, {}, GRANT_ID)], grants=book.get)
    again, _ = group_containers([process(1, 0.5, {}, GRANT_ID)], first, grants=book.get)
    assert again[CONTAINER_ID].limits is first[CONTAINER_ID].limits
    other = "e" * 32
    book[other] = a_grant(other, mem_gib=3)
    moved, _ = group_containers([process(1, 0.5, {}, other)], again, grants=book.get)
    assert moved[CONTAINER_ID].cap_bytes(0) == 3 * GIB
    book[other] = dataclasses.replace(book[other], pod="renamed")
    renamed, _ = group_containers([process(1, 0.5, {}, other)], moved, grants=book.get)
    assert renamed[CONTAINER_ID].pod == "ml/renamed"


def test_a_corrected_grant_is_taken_up_with_its_names_only(tmp_path, caplog):
    """The plugin corrects the names of a grant answered for another pod than the one the
    kubelet admitted; the caps the container started with are never changed by a file."""
    path = write(tmp_path, a_grant(mem_gib=1))
    book = GrantBook(tmp_path)
    first = book.get(GRANT_ID, now=0.0)
    assert first is not None and book.get(GRANT_ID, now=0.5) is first
    corrected = dataclasses.replace(a_grant(mem_gib=8), namespace="ml", pod="other")
    partial = path.with_name("partial")
    partial.write_bytes(grants.encode(corrected))
    partial.replace(path)

    assert book.get(GRANT_ID, now=0.9) is first  # not looked at again within RECHECK_S
    with caplog.at_level(logging.INFO):
        later = book.get(GRANT_ID, now=0.0 + RECHECK_S + 0.1)
    assert later is not None and later.pod_key == "ml/other"
    assert later.mem_bytes == first.mem_bytes == (GIB,)
    assert "now names ml/other container main (was ml/granted container main)" in caplog.text
    assert book.get(GRANT_ID, now=RECHECK_S * 3) is later  # unchanged since: the same object


def test_the_agent_finds_a_granted_containers_region_in_its_grants_folder(tmp_path):
    """Not by pod UID and container name (two containers admitted in swapped order would
    share those): by the grant in its mounts, even with no pod UID to go by."""
    directory = tmp_path / "interposer"
    write(directory, a_grant())
    book = GrantBook(directory)
    region = book.region_path(GRANT_ID)
    region.parent.mkdir(parents=True)
    make_region(region)
    [container] = group_containers(
        [GpuProcess(4242, 0, GIB // 2, 10.0, CONTAINER_ID, "", {}, ns_pid=7, grant_id=GRANT_ID)],
        grants=lambda grant_id: book.get(grant_id, now=0.0),
    )[0].values()
    pacer = RegionPacer(directory, slice_s=0.1)
    assert pacer.region_path(container) == region

    with slot_holder(region, slot=0, pid=7):
        assert pacer.paced({CONTAINER_ID: container}) == {CONTAINER_ID}
    pacer.close()


def test_a_grant_mounted_over_the_nodes_does_not_replace_it():
    """A process that mounts a file of its own over /etc/gpushare/grant (in a user and
    mount namespace of its own) still lists the node's mount first: that one counts."""
    forged = "f" * 32
    text = mountinfo(f"/var/lib/gpushare/interposer/grants/{GRANT_ID}/grant") + (
        f"99 22 0:44 /tmp/grants/{forged}/grant {environment.GRANT_IN_CONTAINER} rw - overlay "
        "overlay rw\n"
    )
    assert parse_grant_mount(text) == GRANT_ID


def test_a_grant_that_could_not_be_read_is_asked_for_again_after_retry_s(tmp_path):
    book = GrantBook(tmp_path)
    assert book.get(GRANT_ID, now=100.0) is None
    write(tmp_path, a_grant())
    assert book.get(GRANT_ID, now=100.0 + RETRY_S - 0.5) is None
    assert book.get(GRANT_ID, now=100.0 + RETRY_S) == a_grant()


def test_the_warning_names_the_grant_and_why(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        GrantBook(tmp_path).get(GRANT_ID, now=0.0)
    [record] = caplog.records
    assert record.getMessage().startswith(f"grant {GRANT_ID} cannot be read ([Errno 2]")
    assert record.getMessage().endswith("its container is held to the limits in its environment")


def test_an_unchanged_grant_file_is_not_read_again(tmp_path, monkeypatch):
    write(tmp_path, a_grant())
    book = GrantBook(tmp_path)
    first = book.get(GRANT_ID, now=0.0)
    loads: list[str] = []
    load = GrantBook._load

    def counted(self: GrantBook, grant_id: str, now: float):  # type: ignore[no-untyped-def]
        loads.append(grant_id)
        return load(self, grant_id, now)

    monkeypatch.setattr(GrantBook, "_load", counted)
    assert book.get(GRANT_ID, now=RECHECK_S) is first  # checked at exactly RECHECK_S
    assert book.get(GRANT_ID, now=5 * RECHECK_S) is first
    assert loads == []


def test_a_grant_rewritten_with_the_same_names_stays_the_same_object(tmp_path):
    path = write(tmp_path, a_grant(mem_gib=1))
    book = GrantBook(tmp_path)
    first = book.get(GRANT_ID, now=0.0)
    partial = path.with_name("partial")
    partial.write_bytes(grants.encode(a_grant(mem_gib=4)))  # caps are never taken up
    partial.replace(path)
    assert book.get(GRANT_ID, now=RECHECK_S) is first


def test_a_correction_takes_the_pod_uid_and_container_too(tmp_path):
    path = write(tmp_path, a_grant())
    book = GrantBook(tmp_path)
    book.get(GRANT_ID, now=0.0)
    partial = path.with_name("partial")
    moved = dataclasses.replace(a_grant(), pod_uid="uid-2", namespace="other", container="side")
    partial.write_bytes(grants.encode(moved))
    partial.replace(path)
    later = book.get(GRANT_ID, now=RECHECK_S)
    assert later is not None
    assert (later.pod_uid, later.pod_key, later.container) == ("uid-2", "other/granted", "side")
    assert book.get(GRANT_ID, now=2 * RECHECK_S) is later  # its file's stamp is kept


def test_the_book_keeps_at_most_max_kept_grants(tmp_path, monkeypatch):
    monkeypatch.setattr("gpushare.isolation.grants.MAX_KEPT", 2)
    ids = [f"{n:032x}" for n in range(3)]
    for grant_id in ids:
        write(tmp_path, a_grant(grant_id))
    book = GrantBook(tmp_path)
    for grant_id in ids:
        assert book.get(grant_id, now=0.0) is not None
    (tmp_path / "grants" / ids[0] / "grant").unlink()
    assert book.get(ids[0], now=0.0) is None  # the oldest was let go, and is gone now
    assert book.get(ids[2], now=0.0) is not None


def test_only_the_head_of_a_long_mountinfo_is_read(tmp_path):
    """A tenant that makes many mounts of its own lists them after the node's."""
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    node_mounts = mountinfo(f"/n/grants/{GRANT_ID}/grant")
    filler = "".join(f"{100 + n} 22 0:9 / /tmp/m{n} rw - tmpfs tmpfs rw\n" for n in range(20000))
    late = f"99 22 0:44 /x/grants/{'f' * 32}/grant {environment.GRANT_IN_CONTAINER} rw - x x rw\n"
    (proc / "7" / "mountinfo").write_text(filler + late)
    assert ProcessTable(proc).grant(7) == ""  # the late one is past what is read
    (proc / "7" / "mountinfo").write_text(node_mounts + filler)
    assert ProcessTable(proc).grant(7) == GRANT_ID
