"""What follows an Allocate answer runs on a thread of its own, in order, and a step that
fails is logged without holding up the rest."""

import logging

from gpushare.deviceplugin.allocator import FollowUps


class _Fatal(BaseException):
    """An error no loop catches (as MemoryError or an interpreter exit would be)."""


def test_steps_run_in_order_and_one_that_fails_is_logged_without_stopping_the_rest(caplog):
    done = []

    def broken() -> None:
        raise OSError("disk full")

    follow_ups = FollowUps()
    follow_ups.start()
    with caplog.at_level(logging.ERROR, logger="gpushare.deviceplugin"):
        follow_ups.put(lambda: done.append("journal"))
        follow_ups.put(broken)
        follow_ups.put(lambda: done.append("log"))
        follow_ups.stop()

    assert done == ["journal", "log"]
    assert caplog.messages == ["a step after an Allocate answer failed"]
    assert "OSError: disk full" in caplog.text


def test_a_follow_up_thread_that_dies_says_so_by_name(caplog):
    def fatal() -> None:
        raise _Fatal

    follow_ups = FollowUps()
    with caplog.at_level(logging.CRITICAL, logger="gpushare.deviceplugin"):
        follow_ups.start()
        follow_ups.put(fatal)
        follow_ups.stop()

    assert caplog.messages == [
        "background thread follow-ups died; what it keeps current stays as it is "
        "until the plugin restarts"
    ]
