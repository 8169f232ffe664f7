"""The operator docs stay true to the code: every rule explained, every link resolving."""

import re
from pathlib import Path
from typing import Any

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


def test_readme_starts_with_the_quick_start_and_ends_with_development():
    headings = [
        line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("## ")
    ]
    assert headings.index("## Quick start") < headings.index("## What a pod asks for")
    assert headings.index("## What a pod asks for") < headings.index("## Develop and test")


def test_readme_keeps_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "./scripts/demo" in text and "./scripts/test" in text
    assert "helm install gpushare helm/gpushare" in text
    # The quick start installs from the release's artifacts, as docs/install.md does.
    assert "helm install gpushare ./gpushare-$VERSION.tgz" in text
    assert "gpushare-image-$VERSION.oci.tar" in text
    assert "kubectl label node <NODE> ack.node.gpu.schedule=" in text
    assert "kubectl inspect cgpu" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


CITING_TREES = ("src", "tests", "bench", "scripts", "helm", "docs")
OUTSIDE_DOCUMENTS = re.compile(
    r"DESIGN\.md|DESIGN §|K8S-INTERFACES|PEERS\.md|STYLE\.md|PLACEMENT-BENCHMARK"
)
"""Design notes kept outside the repository: a reader of the code cannot follow them."""
DOCS_CITATION = re.compile(r"docs/([\w.-]+\.md)#([\w-]+)")


def _text_files(*trees: str) -> list[Path]:
    files = []
    for tree in trees:
        for path in sorted((ROOT / tree).rglob("*")):
            parts = path.relative_to(ROOT).parts
            if not path.is_file() or "__pycache__" in parts or parts[1].endswith(".egg-info"):
                continue
            if path.suffix in (".png", ".pyc", ".tgz") or "_pb2" in path.name:
                continue
            files.append(path)
    return files


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} (.+)", line)):
            slug = base = _slug(heading.group(1))
            n = 0
            while slug in anchors:
                n += 1
                slug = f"{base}-{n}"
            anchors.add(slug)
    return anchors


def test_nothing_cites_documents_outside_the_repository():
    this = Path(__file__).resolve()
    cites = [
        f"{path.relative_to(ROOT)}:{n}: {match.group(0)}"
        for path in _text_files(*CITING_TREES)
        if path != this
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        for match in OUTSIDE_DOCUMENTS.finditer(line)
    ]
    assert cites == []


def test_docs_sections_cited_from_the_code_exist():
    cited = {
        (path.relative_to(ROOT), page, anchor)
        for path in _text_files("src", "tests", "bench", "scripts")
        for page, anchor in DOCS_CITATION.findall(path.read_text(errors="replace"))
    }
    assert cited, "the code cites no docs section: the pattern is wrong"
    missing = [
        f"{path}: docs/{page}#{anchor}"
        for path, page, anchor in sorted(cited)
        if not (ROOT / "docs" / page).exists() or anchor not in _anchors(ROOT / "docs" / page)
    ]
    assert missing == []


def test_slugs_follow_github():
    assert _slug("Device plugin API v1beta1") == "device-plugin-api-v1beta1"
    assert _slug("`gpushare simulate`") == "gpushare-simulate"
    assert _slug("Merging Allocate answers") == "merging-allocate-answers"
    assert _slug("The requeue nudge (`gpushare.io/requeued-at`)") == (
        "the-requeue-nudge-gpushareiorequeued-at"
    )


def _registries() -> list[Any]:
    """The registries of the three components, with every family they can export."""
    from gpushare.deviceplugin.metrics import PluginMetrics
    from gpushare.draplugin.metrics import DriverMetrics
    from gpushare.extender.cache import SchedulerCache
    from gpushare.extender.metrics import ExtenderMetrics
    from gpushare.isolation.metrics import AgentMetrics

    plugin = PluginMetrics("node")
    plugin.watch_gpus(lambda: (), lambda: [])
    return [
        plugin.registry,
        ExtenderMetrics(SchedulerCache()).registry,
        AgentMetrics("node").registry,
        DriverMetrics("node", lambda: {0: (4, 0, 1)}).registry,
    ]


def _exported_metric_names() -> set[str]:
    """Every series name the three components can export, from their own registries."""
    suffixes = {"counter": ("_total",), "histogram": ("", "_bucket", "_count", "_sum")}
    return {
        family.name + suffix
        for registry in _registries()
        for family in registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def _exported_families() -> set[str]:
    """Every metric as an operator queries it: counters with `_total`, histograms by their
    base name."""
    return {
        family.name + ("_total" if family.type == "counter" else "")
        for registry in _registries()
        for family in registry.collect()
    }


def test_every_exported_metric_is_described_in_the_metrics_page():
    page = (ROOT / "docs" / "metrics.md").read_text()
    described = set(re.findall(r"^\| `(gpushare_\w+)` \|", page, re.M))
    assert described, "the metrics page describes no metric: the pattern is wrong"
    exported = _exported_families()
    assert sorted(exported - described) == []
    assert sorted(described - exported) == []


METRIC_NAME = re.compile(
    r"gpushare_(?:gpu|device_plugin|dra_plugin|extender|admission|isolation|scheduler)_\w+(?![\w*])"
)
"""A metric name; a family written `gpushare_gpu_*` in prose is not one."""


def test_every_metric_the_docs_and_dashboard_name_is_exported():
    exported = _exported_metric_names()
    sources = [*PAGES, ROOT / "helm" / "gpushare" / "files" / "dashboard.json"]
    named = {(p.name, m) for p in sources for m in METRIC_NAME.findall(p.read_text())}
    assert named, "the docs name no metric: the pattern is wrong"
    assert sorted((page, m) for page, m in named if m not in exported) == []
