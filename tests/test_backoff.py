"""The one retry policy: doubling delays up to a cap, jittered around each step."""

import pytest

from gpushare.backoff import Backoff


def test_delays_double_up_to_the_maximum():
    backoff = Backoff(initial=1, maximum=8, jitter=0)
    assert [backoff.delay(n) for n in range(1, 6)] == [1, 2, 4, 8, 8]


def test_no_failure_yet_waits_the_initial_delay():
    assert Backoff(initial=0.5, jitter=0).delay(0) == 0.5


def test_a_long_outage_stays_at_the_maximum():
    assert Backoff(initial=0.1, maximum=30, jitter=0).delay(10_000) == 30


def test_jitter_spreads_each_delay_within_its_fraction():
    draws: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        draws.append((low, high))
        return high

    backoff = Backoff(initial=2, maximum=8, jitter=0.25, uniform=uniform)
    assert backoff.delay(2) == pytest.approx(4 * 1.25)
    assert draws == [(-0.25, 0.25)]


def test_real_jitter_stays_in_bounds():
    backoff = Backoff(initial=1, maximum=1, jitter=0.2)
    delays = [backoff.delay(1) for _ in range(200)]
    assert all(0.8 <= d <= 1.2 for d in delays)
    assert len(set(delays)) > 1


@pytest.mark.parametrize(
    "kwargs",
    [{"initial": 0}, {"initial": 5, "maximum": 1}, {"factor": 0.5}, {"jitter": 1}],
)
def test_nonsense_is_refused(kwargs):
    with pytest.raises(ValueError):
        Backoff(**kwargs)
