"""The Grafana dashboard (helm/gpushare/files/dashboard.json): every panel's query is
valid PromQL (promtool parses it), names only metrics some component exports, and uses
only the dashboard's own variables; the per-container view picks a pod by namespace and
name, the labels the isolation agent's series carry."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.chart.rendering import CHART
from tests.test_docs import _exported_metric_names

DASHBOARD = json.loads((CHART / "files" / "dashboard.json").read_text())
VARIABLE = re.compile(r"\$\{?(\w+)\}?")
GRAFANA_INTERVALS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}


def targets() -> list[tuple[str, str]]:
    """(panel title, expr) of every query of the dashboard."""
    return [
        (panel["title"], target["expr"])
        for panel in DASHBOARD["panels"]
        for target in panel.get("targets", [])
    ]


def as_prometheus_sees_it(expr: str) -> str:
    """The query Grafana sends with every variable set to all (`.*`)."""
    return VARIABLE.sub(lambda m: GRAFANA_INTERVALS.get(m.group(1), ".*"), expr)


def test_every_panel_query_is_valid_promql(tmp_path: Path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's `prometheus` package)")
    rules = [
        {"record": f"dashboard:panel_{i}:query", "expr": as_prometheus_sees_it(expr)}
        for i, (_, expr) in enumerate(targets())
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_a_broken_query_is_caught_by_the_check(tmp_path: Path):
    """The check above can fail: promtool refuses what Prometheus would."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's `prometheus` package)")
    rules = {"groups": [{"name": "d", "rules": [{"record": "r", "expr": "sum by (node (x)"}]}]}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, timeout=60
    )
    assert result.returncode != 0


def test_every_metric_a_panel_reads_is_exported_by_a_component():
    exported = _exported_metric_names()
    named = {
        (title, name) for title, expr in targets() for name in re.findall(r"\bgpushare_\w+", expr)
    }
    assert named
    assert sorted((title, name) for title, name in named if name not in exported) == []


def test_panels_use_only_the_dashboards_variables():
    defined = {v["name"] for v in DASHBOARD["templating"]["list"]} | set(GRAFANA_INTERVALS)
    used = {(title, m) for title, expr in targets() for m in VARIABLE.findall(expr)}
    assert sorted((title, v) for title, v in used if v not in defined) == []


def test_the_per_container_view_picks_pods_by_namespace_and_name():
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert "label_values(" in variables["namespace"]["definition"]
    assert ", namespace)" in variables["namespace"]["definition"]
    assert '$namespace"' in variables["pod"]["definition"]  # pods of the namespaces chosen
    assert variables["pod"]["definition"].endswith(", pod)")
    per_container = [
        (title, expr)
        for title, expr in targets()
        if "gpushare_isolation_" in expr and "pod" in expr
    ]
    wanted = {
        "gpushare_isolation_memory_used_bytes",
        "gpushare_isolation_memory_cap_bytes",
        "gpushare_isolation_utilization_percent",
        "gpushare_isolation_compute_limit_percent",
        "gpushare_isolation_held_seconds_total",
        "gpushare_isolation_launches_held_total",
        "gpushare_isolation_allocations_refused_total",
        "gpushare_isolation_memory_cap_violations_total",
    }
    shown = {m for _, expr in per_container for m in re.findall(r"\bgpushare_\w+", expr)}
    assert wanted <= shown, wanted - shown
    for title, expr in per_container:
        assert 'namespace=~"$namespace"' in expr and 'pod=~"$pod"' in expr, title


def test_each_gpu_has_the_agents_utilisation_memory_policy_and_health():
    exprs = " ".join(expr for _, expr in targets())
    for name in (
        "gpushare_isolation_gpu_utilization_percent",
        "gpushare_isolation_gpu_memory_used_bytes",
        "gpushare_isolation_gpu_memory_total_bytes",
        "gpushare_isolation_gpu_policy",
        "gpushare_isolation_gpu_healthy",
    ):
        assert f"max by (node, gpu) ({name}" in exprs, name


def test_panels_do_not_overlap():
    taken: set[tuple[int, int]] = set()
    for panel in DASHBOARD["panels"]:
        box = panel["gridPos"]
        cells = {
            (x, y)
            for x in range(box["x"], box["x"] + box["w"])
            for y in range(box["y"], box["y"] + box["h"])
        }
        assert not cells & taken, panel["title"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        taken |= cells
