"""`gpushare simulate` end to end on a subsample of the openb trace: flags, table and
legend, JSON, plot."""

import json
import os
import sys

import pytest

from gpushare.cli.main import build_parser, main
from gpushare.simulator.report import COLUMNS
from tests.simulator.traces import subsample


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Every 25th node and pod of openb: 49 nodes of every kind, 327 pods."""
    return subsample(tmp_path_factory.mktemp("trace"), every=25)


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    flags = ("--nodes", "--pods", "--policies", "--seeds", "--workers", "--json", "--plot")
    for flag in (*flags, "--no-plot", "--no-progress"):
        assert flag in out
    assert "@learned" in out


def test_seed_lists_and_ranges_parse():
    args = build_parser().parse_args(["simulate", "--seeds", "42-44,50,43"])
    assert args.seeds == [42, 43, 44, 50]
    assert build_parser().parse_args(["simulate"]).seeds == list(range(42, 52))


def test_defaults_are_our_policy_and_the_references_on_all_cores():
    args = build_parser().parse_args(["simulate"])
    assert [c.label for c in args.policies] == ["fgd-lookahead", "fgd", "bestfit"]
    assert args.workers == (os.cpu_count() or 1)
    assert args.json is None and args.plot is None and not args.no_plot


def test_no_progress_bar_when_stderr_is_not_a_terminal(small, tmp_path, capsys):
    # tests/simulator/test_progress.py draws them on a terminal.
    nodes, pods = small
    flags = ["--nodes", str(nodes), "--pods", str(pods), "--policies", "bestfit", "--no-plot"]
    assert main(["simulate", *flags, "--seeds", "42-43", "--workers", "1"]) == 0
    assert capsys.readouterr().err == ""


def test_plot_and_no_plot_together_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--plot", "r.png", "--no-plot"])
    assert exit_.value.code == 2
    assert "not allowed with argument --plot" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--seeds", "51-42"], "runs backwards"),
        (["--seeds", "x"], "not a whole number"),
        (["--policies", "random"], "unknown placement policy 'random'"),
        (["--policies", "binpack@learned"], "does not use a target workload"),
        (["--policies", "fgd,fgd"], "named twice"),
    ],
)
def test_bad_flags_are_refused_with_the_reason(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", *flags])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_trace_file_is_reported(capsys, tmp_path):
    code = main(["simulate", "--nodes", str(tmp_path / "none.csv"), "--no-progress"])
    assert code == 1  # a run that cannot start, not a bad flag
    assert "cannot read trace file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--json", "{tmp}/absent/r.json"], "--json {tmp}/absent/r.json: folder"),
        (["--json", "{tmp}"], "is a directory"),
        (["--plot", "{tmp}/absent/r.png"], "--plot {tmp}/absent/r.png: folder"),
        (["--plot", "{tmp}/r.svg"], "the plot is a PNG"),
    ],
)
def test_output_files_that_cannot_be_written_are_refused_before_the_run(
    capsys, tmp_path, flags, message
):
    argv = [f.format(tmp=tmp_path) for f in flags]
    code = main(["simulate", *argv, "--nodes", str(tmp_path / "none.csv"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_plot_asked_for_without_matplotlib_names_the_extra_before_the_run(
    capsys, tmp_path, monkeypatch
):
    # The image installs no matplotlib: `--plot FILE` there must say how to get it, at once.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    argv = ["--plot", str(tmp_path / "r.png"), "--nodes", str(tmp_path / "none.csv")]
    code = main(["simulate", *argv, "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "needs matplotlib (the package's plot extra: pip install 'matplotlib>=3.8')" in err
    assert "Traceback" not in err
    assert not (tmp_path / "r.png").exists()


def simulate_here(small, *flags: str) -> int:
    nodes, pods = small
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policies", "fgd,bestfit"]
    return main([*argv, "--seeds", "42", "--workers", "1", *flags])


def test_the_plot_is_written_in_the_current_folder_by_default(small, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert simulate_here(small) == 0
    plot = tmp_path / "placement-unallocated.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.splitlines()[-1] == f"plot: {plot}"


def test_without_matplotlib_the_default_plot_is_skipped_with_one_line(
    small, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert simulate_here(small) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == (
        "plot: skipped, it needs matplotlib (the package's plot extra: pip install "
        "'matplotlib>=3.8')"
    )
    assert "Traceback" not in out + err and err == ""
    assert list(tmp_path.iterdir()) == []


def test_no_plot_writes_none_and_says_nothing_of_it(small, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert simulate_here(small, "--no-plot") == 0
    assert list(tmp_path.iterdir()) == []
    assert "plot" not in capsys.readouterr().out.splitlines()[-1]


def test_a_malformed_trace_row_is_one_line_naming_file_and_line(capsys, small, tmp_path):
    nodes, _ = small
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np1,1000,1024\n")
    code = main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err == f"gpushare simulate: {pods}:2: the row has fewer fields than the header's 6"


def test_a_run_prints_the_table_and_writes_json_and_plot(small, tmp_path, capsys):
    nodes, pods = small
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    code = main(
        [
            "simulate",
            "--nodes", str(nodes),
            "--pods", str(pods),
            "--policies", "fgd-lookahead@learned,fgd,bestfit,fgd@learned,binpack,spread",
            "--seeds", "42-43",
            "--workers", "1",
            "--json", str(out_json),
            "--plot", str(out_png),
            "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("gpushare simulate: 49 nodes")
    lines = out.splitlines()
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    header = lines.index("") + 1  # after the lines that say what runs
    assert " ".join(lines[header].split()) == (
        "policy @100 med mean min-max @130 frag ratio multi vs fgd run s"
    )
    assert lines[header + 1].split()[0] == "fgd-lookahead@learned"
    legend = lines[header + 7 :]  # after six rows and a blank line
    assert legend[1].split()[:3] == ["policy", "placement", "policy;"]
    assert [line.split()[0] for line in legend if line.startswith("  ") and line[2] != " "] == [
        c.header.split()[0] for c in COLUMNS
    ]
    document = json.loads(out_json.read_text())
    assert document["trace"]["node_count"] == 49
    assert set(document["policies"]) == {
        "fgd-lookahead@learned", "fgd", "bestfit", "fgd@learned", "binpack", "spread"
    }  # fmt: skip
    for label, entry in document["policies"].items():
        assert entry["seeds"] == [42, 43]
        for bin_ in ("100", "130"):
            spread = entry["unallocated_pct"][bin_]
            assert spread["min"] <= spread["median"] <= spread["max"]
            assert spread["min"] <= spread["mean"] <= spread["max"]
            assert spread["min"] >= 0 and spread["max"] <= 100
        assert set(entry["frag_amount_pct"]) == {"50", "80", "90"}
        assert set(entry["frag_ratio_pct"]) == {"50", "80", "90"}
        assert set(entry["failed_pods"]) >= {"cpu", "sharing", "1-gpu", "2-gpu", "4-gpu", "8-gpu"}
        assert entry["wall_s"] > 0
        assert ("paired_vs_fgd" in entry) == (label != "fgd")
    paired = document["policies"]["bestfit"]["paired_vs_fgd"]
    assert len(paired["diff_100"]) == 2
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_two_workers_give_the_same_numbers_as_one(small, tmp_path):
    nodes, pods = small
    documents = []
    for workers in (1, 2):
        path = tmp_path / f"w{workers}.json"
        flags = ["--nodes", str(nodes), "--pods", str(pods), "--policies", "fgd,bestfit"]
        flags += ["--seeds", "42-43", "--workers", str(workers), "--json", str(path)]
        main(["simulate", *flags, "--no-progress", "--no-plot"])
        documents.append(json.loads(path.read_text()))
    for label in ("fgd", "bestfit"):
        one, two = (d["policies"][label] for d in documents)
        assert one["unallocated_pct"] == two["unallocated_pct"]
        assert one["failed_pods"] == two["failed_pods"]
