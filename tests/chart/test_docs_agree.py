"""docs/kind.md, docs/coexistence.md and docs/install.md say what the chart does: the
`helm install` commands they give render, and the labels and resources they name are
the code's."""

import re
from pathlib import Path

import helm_python as helm
import pytest

from gpushare.inventory import parse_layout
from gpushare.labels import LABEL_LEGACY_CGPU, LABEL_LEGACY_SHARE, LABEL_SCHEDULE, NodeMode
from gpushare.resources import MANAGED_RESOURCES
from tests.chart.rendering import CHART, FULLNAME, render

DOCS = CHART.parents[1] / "docs"
HELM_INSTALL = re.compile(r"helm install gpushare .*?(?<!\\)\n", re.S)


def helm_installs(page: Path) -> list[str]:
    """Each `helm install` command of the page's code blocks, continuation lines joined."""
    return [m.group(0).replace("\\\n", " ") for m in HELM_INSTALL.finditer(page.read_text())]


def set_values(command: str) -> dict:
    values: dict = {}
    for expression in re.findall(r"--set (\S+)", command):
        values = _merge(values, helm.parse_set_string(expression))
    return values


def _merge(into: dict, more: dict) -> dict:
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


@pytest.mark.parametrize("page", ["kind.md"])
def test_each_helm_install_of_the_page_renders_with_mock_gpus_the_nodes_can_read(page):
    commands = helm_installs(DOCS / page)
    assert len(commands) == 2  # from the release artifacts, and from a checkout
    for command in commands:
        values = set_values(command.replace("$V", "0.1.0"))
        assert values["gpu"]["backend"] == "mock"
        assert parse_layout(values["gpu"]["mockGpus"])
        daemonset = render(values).one("DaemonSet")
        env = {
            e["name"]: e.get("value")
            for c in daemonset["spec"]["template"]["spec"]["containers"]
            for e in c.get("env", [])
        }
        assert env["GPUSHARE_MOCK_GPUS"] == values["gpu"]["mockGpus"]


def test_the_kind_page_expects_the_memory_its_layout_gives():
    text = (DOCS / "kind.md").read_text()
    [command, _] = helm_installs(DOCS / "kind.md")
    gpus = parse_layout(set_values(command)["gpu"]["mockGpus"])
    total = sum(g.mem for g in gpus)
    assert f'"aliyun.com/gpu-count":"{len(gpus)}","aliyun.com/gpu-mem":"{total}"' in text
    assert f"grep -q {total}" in text


def test_coexistence_names_the_labels_the_chart_selects_and_the_resources_it_advertises():
    text = " ".join((DOCS / "coexistence.md").read_text().split())
    terms = render().one("DaemonSet")["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    selected = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [[schedule], [legacy_share], [legacy_cgpu]] = [t["matchExpressions"] for t in selected]
    assert schedule["key"] == LABEL_SCHEDULE
    assert sorted(schedule["values"]) == sorted(m.value for m in NodeMode)
    assert f"`{LABEL_SCHEDULE} In [share, cgpu, core_mem]`" in text
    for expression, label in ((legacy_share, LABEL_LEGACY_SHARE), (legacy_cgpu, LABEL_LEGACY_CGPU)):
        assert expression["key"] == label and expression["values"] == ["true"]
        assert f"`{label}=true`" in text
    for resource in MANAGED_RESOURCES:
        assert f"`{resource}`" in text
    tolerated = {
        t["key"] for t in render().one("DaemonSet")["spec"]["template"]["spec"]["tolerations"]
    }
    assert "nvidia.com/gpu" in tolerated and "`nvidia.com/gpu:NoSchedule`" in text


def dra_section() -> str:
    text = (DOCS / "install.md").read_text()
    return text.split("\n## DRA mode\n", 1)[1].split("\n## ", 1)[0]


def test_the_dra_installs_render_on_the_versions_the_guide_gives_them():
    """The first command is for 1.36 and later; the second, with the gate value, for
    1.34 and 1.35, where the first is refused naming the gate."""
    latest, gated = [
        set_values(m.group(0).replace("\\\n", " ")) for m in HELM_INSTALL.finditer(dra_section())
    ]
    assert latest["dra"] == {"enabled": True}
    assert render(latest, kube_version="v1.36.0").one("DaemonSet", f"{FULLNAME}-dra-node")
    with pytest.raises(helm.HelmRenderError, match="DRAConsumableCapacity"):
        render(latest, kube_version="v1.35.0")
    assert gated["dra"] == {"enabled": True, "consumableCapacityGate": True}
    for version in ("v1.34.0", "v1.35.0"):
        assert render(gated, kube_version=version).one("DaemonSet", f"{FULLNAME}-dra-node")


def test_the_dra_section_names_the_label_the_values_and_the_objects_of_the_chart():
    section = " ".join(dra_section().split())
    rendered = render({"dra": {"enabled": True}}, kube_version="v1.36.0")
    spec = rendered.one("DaemonSet", f"{FULLNAME}-node")["spec"]["template"]["spec"]
    affinity = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    [expression] = {
        (e["key"], e["operator"], tuple(e["values"]))
        for t in affinity["nodeSelectorTerms"]
        for e in t["matchExpressions"]
        if e["key"] != LABEL_SCHEDULE and e["key"] not in (LABEL_LEGACY_SHARE, LABEL_LEGACY_CGPU)
    }
    key, operator, values = expression
    assert f"`{key} {operator} [{', '.join(values)}]`" in section
    assert f"{key}=dra" in section
    assert "kubectl label node <NODE> ack.node.gpu.schedule=cgpu gpushare.io/driver=dra" in section
    with helm.Chart.load(CHART) as chart:
        values = chart.values["dra"]
    for name in values:
        assert f"`dra.{name}" in section, name
    for name in ("dra-node", "dra-plugin-own-node"):
        assert name in section
    assert rendered.one("DeviceClass")["metadata"]["name"] in section
