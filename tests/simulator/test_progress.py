"""`gpushare simulate`'s progress bars: one per run (policy and seed) and one counting the
runs, drawn only on a terminal, from runs in this process and in worker processes."""

import io

import pytest

from gpushare.cli.progress import STEPS, RunBars, throttled
from gpushare.cli.simulate import run_all
from gpushare.simulator.run import PolicyChoice
from gpushare.simulator.trace import load
from tests.simulator.traces import subsample


class Terminal(io.StringIO):
    """What tqdm writes, from a file that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Every 25th node and pod of openb: runs long enough for a worker's first reports to
    come before its result."""
    return load(*subsample(tmp_path_factory.mktemp("trace"), every=25))


def test_no_bar_is_drawn_off_a_terminal():
    log = io.StringIO()
    bars = RunBars(2, log)
    bars.advance("fgd", 42, 10, 100)
    bars.finished("fgd", 42)
    bars.close()
    assert not bars.shown and log.getvalue() == ""


def test_on_a_terminal_each_run_has_a_bar_named_by_policy_and_seed():
    screen = Terminal()
    bars = RunBars(2, screen)
    assert bars.shown
    bars.advance("fgd-lookahead@learned", 42, 0, 200)
    bars.advance("fgd-lookahead@learned", 42, 50, 200)
    assert "fgd-lookahead@learned seed 42:   0%" in screen.getvalue()
    assert "0/200 [" in screen.getvalue()
    bars.finished("fgd-lookahead@learned", 42)
    bars.close()
    assert "runs:  50%" in screen.getvalue() and "1/2" in screen.getvalue()


def test_a_report_that_comes_after_its_runs_result_draws_nothing():
    screen = Terminal()
    bars = RunBars(1, screen)
    bars.advance("fgd", 42, 10, 100)
    bars.finished("fgd", 42)
    drawn = screen.getvalue()
    bars.advance("fgd", 42, 100, 100)  # relayed from a worker after the result came back
    assert screen.getvalue() == drawn


def test_a_run_reports_about_a_hundred_times_and_always_its_end():
    reports: list[tuple[str, int, int, int]] = []
    report = throttled(lambda *r: reports.append(r), "bestfit", 7)
    for offered in range(1051):
        report(offered, 1050)
    assert 0.9 * STEPS <= len(reports) <= 1.1 * STEPS
    assert reports[-1] == ("bestfit", 7, 1050, 1050)
    few: list[tuple[str, int, int, int]] = []
    short = throttled(lambda *r: few.append(r), "bestfit", 7)
    for offered in range(4):
        short(offered, 3)
    assert [r[2] for r in few] == [0, 1, 2, 3]


@pytest.mark.parametrize("workers", [1, 2])
def test_runs_here_and_in_workers_fill_their_bars(small, workers):
    screen = Terminal()
    jobs = [(PolicyChoice.parse("bestfit"), seed, 1.3, None, None) for seed in (42, 43)]
    bars = RunBars(len(jobs), screen)
    for result in run_all(small, jobs, workers, bars):
        bars.finished(result.policy, result.seed)
        total = result.pods
    bars.close()
    drawn = screen.getvalue()
    for seed in (42, 43):
        assert f"bestfit seed {seed}:" in drawn
    assert f"/{total}" in drawn and "runs: 100%" in drawn
