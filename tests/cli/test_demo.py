"""`gpushare demo` and `gpushare --help` as a user runs them."""

import subprocess
import sys

import pytest

from gpushare.cli.main import main


def test_help_lists_the_subcommands():
    result = subprocess.run(
        [sys.executable, "-m", "gpushare.cli.main", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert "demo" in result.stdout


def test_demo_places_every_valid_example_and_refuses_the_invalid_one(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "NODE" in out and "MEM(GiB)" in out
    for name in [
        "cuda-sample-0",
        "cuda-sample-2",
        "gputest-0",
        "multi-gpu-split",
        "exclusive-gpu",
        "two-containers",
    ]:
        assert f"default/{name} -> gpu-node-" in out, name
    assert "default/core-33 refused" in out
    assert "multiple of 5, got 33" in out


def test_demo_runs_the_examples_in_dra_mode_too(capsys):
    assert main(["demo"]) == 0
    dra = capsys.readouterr().out.split("DRA mode on gpu-node-dra")[1]
    assert "published 2 shareable GPU(s) (cores, memory, shares)" in dra
    assert "default/two-containers: claim two-containers-gpushare allocated:" in dra
    assert "default/core-33: refused by the webhook" in dra
    server = dra.split("container server:")[1]
    assert "ALIYUN_COM_GPU_MEM_CONTAINER=4" in server and "ALIYUN_COM_GPU_MEM_POD=6" in server
    trainer = dra.split("default/exclusive-gpu:")[1].split("default/")[0]
    assert "CGPU_DISABLE=true" in trainer


def test_demo_without_examples_says_how_to_fix_it(tmp_path, capsys):
    assert main(["demo", "--examples", str(tmp_path / "missing")]) == 1
    assert f"gpushare demo: --examples {tmp_path / 'missing'}: does not exist" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("args", [["demo", "--help"]])
def test_subcommand_help_explains_flags(args, capsys):
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 0
    assert "--examples" in capsys.readouterr().out
