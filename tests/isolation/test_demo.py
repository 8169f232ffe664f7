"""The isolation stage of `gpushare demo`."""

import re

from gpushare.cli.demo.isolation import run_stage
from gpushare.cli.main import main


def row(report: str, pod: str) -> list[str]:
    [line] = [line for line in report.splitlines() if line.split()[:1] == [pod]]
    return line.split()


def test_the_stage_shows_shares_a_write_refused_and_a_cap_violation_handled():
    report = run_stage()
    assert "control tree: GPU 0: policy 2 (weight-preemptive)" in report
    assert "refused write '9' to 1/policy" in report
    violation = r"memory cap exceeded: container \w+ of pod default/leaky .* killed pid"
    assert re.search(violation, report)
    for pod, target in [("train-a", 33.3), ("train-b", 66.7), ("infer", 30.0)]:
        cells = row(report, pod)
        assert cells[-2] == f"{target:.1f}%"
        assert abs(float(cells[-1].rstrip("%")) - target) <= 3, cells
    assert "killed at t=3.0s" in report
    assert "$ cgpu-smi" in report
    smi_part = report.split("$ cgpu-smi", 1)[1]
    assert "policy 2 (weight-preemptive)" in smi_part and "policy 3 (fixed)" in smi_part
    leaky = [line for line in smi_part.splitlines() if "default/leaky" in line]
    assert leaky and leaky[0].split()[-1] == "1"


def test_gpushare_demo_ends_with_the_isolation_stage(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.index("MEM(GiB)") < out.index("Isolation agent on gpu-node-1")
    assert out.index("Isolation agent on gpu-node-1") < out.index("$ cgpu-smi")
