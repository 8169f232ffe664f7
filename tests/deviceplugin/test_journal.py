"""The grant journal: answers are known at once, their lines reach the file when
written (after the answer has left), and survive a restart."""

from pathlib import Path

from gpushare.deviceplugin.journal import Grant, GrantJournal
from gpushare.resources import GPU_MEM


def grant(uid: str, *ids: str) -> Grant:
    return Grant(GPU_MEM, frozenset(ids), uid, f"default/{uid}", "main", ())


def test_a_recorded_grant_is_answered_at_once_and_reaches_the_file_when_written(tmp_path: Path):
    path = tmp_path / "grants.jsonl"
    journal = GrantJournal(path)
    journal.record(grant("a", "x-1", "x-2"))

    assert journal.answered(GPU_MEM, ["x-2", "x-1"]) == ("a", "main")
    assert GrantJournal(path).answered(GPU_MEM, ["x-1", "x-2"]) is None

    journal.write()
    assert GrantJournal(path).answered(GPU_MEM, ["x-1", "x-2"]) == ("a", "main")
    journal.write()  # nothing new: nothing written twice
    assert len(path.read_text().splitlines()) == 1


def test_add_writes_at_once_and_close_writes_what_is_left(tmp_path: Path):
    path = tmp_path / "grants.jsonl"
    journal = GrantJournal(path)
    journal.add(grant("a", "x-1"))
    assert GrantJournal(path).answered(GPU_MEM, ["x-1"]) == ("a", "main")
    journal.record(grant("b", "x-2"))
    journal.close()
    assert GrantJournal(path).answered(GPU_MEM, ["x-2"]) == ("b", "main")


def test_a_pod_gone_before_its_line_was_written_never_reaches_the_file(tmp_path: Path):
    path = tmp_path / "grants.jsonl"
    journal = GrantJournal(path)
    journal.add(grant("a", "x-1"))
    journal.record(grant("b", "x-2"))
    journal.record(grant("c", "x-3"))

    journal.keep_pods(["a", "c"])
    journal.write()

    reloaded = GrantJournal(path)
    assert reloaded.answered(GPU_MEM, ["x-1"]) == ("a", "main")
    assert reloaded.answered(GPU_MEM, ["x-2"]) is None
    assert reloaded.answered(GPU_MEM, ["x-3"]) == ("c", "main")
    assert len(path.read_text().splitlines()) == 2
