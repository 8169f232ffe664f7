"""The operator docs stay true to the code: every rule explained, every link resolving."""

import re
from pathlib import Path

import pytest

from gpushare.errors import Rule
from gpushare.labels import NodeMode

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "examples" / "README.md",
        ROOT / "helm" / "gpushare" / "README.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)


def test_troubleshooting_explains_every_rule():
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    missing = [rule.value for rule in Rule if f"`{rule.value}`" not in text]
    assert missing == []


def test_modes_page_covers_every_mode():
    text = (ROOT / "docs" / "modes.md").read_text()
    assert all(f"`{mode.value}`" in text for mode in NodeMode)


def test_readme_keeps_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "./scripts/demo" in text and "./scripts/test" in text
    assert "helm install gpushare helm/gpushare" in text
    assert "kubectl label node <NODE> ack.node.gpu.schedule=" in text
    assert "kubectl inspect cgpu" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def _exported_metric_names() -> set[str]:
    """Every series name the three components can export, from their own registries."""
    from gpushare.deviceplugin.metrics import PluginMetrics
    from gpushare.extender.cache import SchedulerCache
    from gpushare.extender.metrics import ExtenderMetrics
    from gpushare.isolation.metrics import AgentMetrics

    plugin = PluginMetrics("node")
    plugin.watch_gpus(lambda: (), lambda: [])
    registries = [plugin.registry, ExtenderMetrics(SchedulerCache()).registry]
    registries.append(AgentMetrics("node").registry)
    suffixes = {"counter": ("_total",), "histogram": ("", "_bucket", "_count", "_sum")}
    return {
        family.name + suffix
        for registry in registries
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


METRIC_NAME = re.compile(
    r"gpushare_(?:gpu|device_plugin|extender|admission|isolation|scheduler)_\w+(?![\w*])"
)
"""A metric name; a family written `gpushare_gpu_*` in prose is not one."""


def test_every_metric_the_docs_and_dashboard_name_is_exported():
    exported = _exported_metric_names()
    sources = [*PAGES, ROOT / "helm" / "gpushare" / "files" / "dashboard.json"]
    named = {(p.name, m) for p in sources for m in METRIC_NAME.findall(p.read_text())}
    assert named, "the docs name no metric: the pattern is wrong"
    assert sorted((page, m) for page, m in named if m not in exported) == []
