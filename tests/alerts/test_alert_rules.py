"""The alert rules, checked and unit-tested by Prometheus's own promtool: each alert
pending before its `for`, firing after it and resolved once its cause is gone
(gpushare_test.yaml), and each with a runbook in docs/troubleshooting.md."""

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.prometheus import ALERTS, PrometheusUnavailable, binary
from tests.test_docs import METRIC_NAME, _anchors, _exported_metric_names

HERE = Path(__file__).resolve().parent
TROUBLESHOOTING = HERE.parents[1] / "docs" / "troubleshooting.md"
RUNBOOK_BASE = "https://github.com/gpushare/gpushare/blob/main/docs/troubleshooting.md#"


def rules() -> list[dict[str, Any]]:
    return [
        rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]
    ]


@pytest.fixture(scope="module")
def promtool() -> Path:
    try:
        return binary("promtool")
    except PrometheusUnavailable as err:
        pytest.skip(str(err))


def _promtool(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, timeout=120, cwd=HERE
    )


def test_promtool_accepts_the_rules_file(promtool):
    result = _promtool(promtool, "check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_every_alert_fires_and_resolves_in_promtools_unit_tests(promtool):
    result = _promtool(promtool, "test", "rules", "gpushare_test.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_unit_tests_make_every_alert_fire():
    tests = yaml.safe_load((HERE / "gpushare_test.yaml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    resolved = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if not case["exp_alerts"]
    }
    names = {rule["alert"] for rule in rules()}
    assert fired == names and resolved == names


def test_every_alert_says_what_where_how_bad_and_where_its_runbook_is():
    for rule in rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["for"], name
        assert {"summary", "description", "runbook_url"} <= rule["annotations"].keys(), name
        assert rule["annotations"]["runbook_url"] == RUNBOOK_BASE + name.lower(), name


def test_every_alert_has_its_runbook_section():
    anchors = _anchors(TROUBLESHOOTING)
    missing = [
        r["alert"] for r in rules() if r["annotations"]["runbook_url"].split("#")[1] not in anchors
    ]
    assert missing == []
    text = TROUBLESHOOTING.read_text()
    for rule in rules():
        section = text.split(f"### {rule['alert']}\n", 1)[1].split("\n### ", 1)[0]
        for part in ("**What it means.**", "**What to check.**", "**What to do.**"):
            assert part in section, f"{rule['alert']}: no {part}"
        # What to check: exact commands and queries.
        assert re.search(r"```bash\n", section), rule["alert"]
        assert re.search(r"```promql\n", section), rule["alert"]


def test_every_metric_the_rules_name_is_exported():
    """A rule over a series no component exports never fires."""
    named = set(METRIC_NAME.findall(ALERTS.read_text()))
    assert named, "the rules name no metric: the pattern is wrong"
    assert sorted(named - _exported_metric_names()) == []
