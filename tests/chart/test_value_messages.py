"""A value of the wrong form fails `helm install` with a message an operator can act
on: the value's path, what it got and an example of a good one, never a regular
expression. Rendered by Helm's own engine, as the other chart tests."""

import json

import helm_python as helm
import pytest

from gpushare.inventory import parse_layout
from tests.chart.rendering import CHART, render

LAYOUT_EXAMPLE = "e.g. 2x16GiB or 1x24GiB:A10,1x80GiB:A100"

# (values, the value's path, what it got, the example the message shows)
BAD = [
    ({"gpu": {"mockGpus": "abc"}}, "gpu.mockGpus", "abc", LAYOUT_EXAMPLE),
    ({"gpu": {"mockGpus": "two big GPUs"}}, "gpu.mockGpus", "two big GPUs", LAYOUT_EXAMPLE),
    ({"gpu": {"mockGpus": "2x16GiB,0x8GiB"}}, "gpu.mockGpus", "2x16GiB,0x8GiB", LAYOUT_EXAMPLE),
    ({"gpu": {"mockGpus": " , "}}, "gpu.mockGpus", " , ", LAYOUT_EXAMPLE),
    ({"gpu": {"runtimeClassName": "NVIDIA"}}, "gpu.runtimeClassName", "NVIDIA", "e.g. nvidia"),
    ({"gpu": {"runtimeClassName": "nvidia runtime"}}, "gpu.runtimeClassName", "nvidia runtime",
     "e.g. nvidia"),
    ({"gpu": {"driverRoot": "run/nvidia/driver"}}, "gpu.driverRoot", "run/nvidia/driver",
     "e.g. /run/nvidia/driver"),
    ({"node": {"kubeletDir": "var/lib/kubelet"}}, "node.kubeletDir", "var/lib/kubelet",
     "e.g. /var/lib/kubelet"),
    ({"isolation": {"controlDir": "cgpu"}}, "isolation.controlDir", "cgpu",
     "e.g. /run/gpushare/cgpu"),
    ({"isolation": {"interposer": {"dir": "relative/dir"}}}, "isolation.interposer.dir",
     "relative/dir", "e.g. /var/lib/gpushare/interposer"),
    ({"dra": {"enabled": True, "cdiDir": "var/run/cdi"}}, "dra.cdiDir", "var/run/cdi",
     "e.g. /var/run/cdi"),
    ({"dra": {"stateDir": "gpushare/dra"}}, "dra.stateDir", "gpushare/dra",
     "e.g. /var/lib/gpushare/dra"),
    ({"scheduler": {"name": "GPU"}}, "scheduler.name", "GPU", "e.g. gpushare-scheduler"),
    ({"scheduler": {"name": "default-scheduler"}}, "scheduler.name", "default-scheduler",
     "e.g. gpushare-scheduler"),
    ({"scheduler": {"extraSchedulerNames": ["ack-co-scheduler", "ack_co_scheduler"]}},
     "scheduler.extraSchedulerNames[1]", "ack_co_scheduler", "e.g. gpushare-scheduler"),
    ({"scheduler": {"extraSchedulerNames": ["default-scheduler"]}},
     "scheduler.extraSchedulerNames[0]", "default-scheduler", "e.g. gpushare-scheduler"),
    ({"scheduler": {"extraSchedulerNames": ["ack-co-scheduler-"]}},
     "scheduler.extraSchedulerNames[0]", "ack-co-scheduler-", "e.g. gpushare-scheduler"),
    ({"scheduler": {"extraSchedulerNames": [""]}}, "scheduler.extraSchedulerNames[0]", "",
     "e.g. gpushare-scheduler"),
    ({"scheduler": {"leaderElection": {"resourceName": "kube-scheduler"}}},
     "scheduler.leaderElection.resourceName", "kube-scheduler", "e.g. gpushare-scheduler"),
    ({"extender": {"urlPrefix": "gpushare-scheduler"}}, "extender.urlPrefix",
     "gpushare-scheduler", "e.g. /gpushare-scheduler"),
    ({"extender": {"httpTimeout": "30"}}, "extender.httpTimeout", "30", "e.g. 30s or 1m30s"),
    ({"metrics": {"prometheusRule": {"runbookBaseUrl": "docs/troubleshooting.md"}}},
     "metrics.prometheusRule.runbookBaseUrl", "docs/troubleshooting.md", "e.g. https://"),
    ({"networkPolicy": {"enabled": True, "apiServerCidrs": ["10.0.0.0/24", "10.0.0.0"]}},
     "networkPolicy.apiServerCidrs[1]", "10.0.0.0", "e.g. 10.0.0.0/24 or fd00::/64"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "path", "got", "example"), BAD, ids=lambda v: json.dumps(v))
def test_a_value_of_the_wrong_form_is_refused_naming_it_with_an_example(values, path, got, example):
    with pytest.raises(helm.HelmRenderError) as refused:
        render(values)
    message = str(refused.value)
    assert f"{path} {json.dumps(got)}" in message
    assert example in message
    assert "pattern" not in message and "^" not in message


# A good value of each form renders, and reaches the objects.
GOOD = [
    ({"gpu": {"backend": "mock", "mockGpus": "1x24GiB:A10,1x80GiB:A100"}},
     "1x24GiB:A10,1x80GiB:A100"),
    ({"gpu": {"runtimeClassName": "nvidia"}}, "nvidia"),
    ({"gpu": {"driverRoot": "/run/nvidia/driver"}}, "/run/nvidia/driver"),
    ({"node": {"kubeletDir": "/var/lib/k0s/kubelet"}}, "/var/lib/k0s/kubelet"),
    ({"isolation": {"controlDir": "/run/cgpu"}}, "/run/cgpu"),
    ({"isolation": {"interposer": {"dir": "/opt/interposer"}}}, "/opt/interposer"),
    ({"dra": {"enabled": True, "cdiDir": "/etc/cdi"}}, "/etc/cdi"),
    ({"dra": {"enabled": True, "stateDir": "/opt/gpushare/dra"}}, "/opt/gpushare/dra"),
    ({"scheduler": {"name": "team-a.gpu"}}, "team-a.gpu"),
    ({"scheduler": {"extraSchedulerNames": ["ack-co-scheduler", "b2"]}}, "b2"),
    ({"scheduler": {"leaderElection": {"resourceName": "gpushare-2"}}}, "gpushare-2"),
    ({"extender": {"urlPrefix": "/gpu"}}, "/gpu"),
    ({"extender": {"httpTimeout": "1m30s"}}, "1m30s"),
    ({"metrics": {"prometheusRule": {"enabled": True, "runbookBaseUrl": "http://wiki.local/gs"}}},
     "http://wiki.local/gs"),
    ({"networkPolicy": {"enabled": True, "apiServerCidrs": ["10.0.0.0/24", "fd00::/64"]}},
     "fd00::/64"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "value"), GOOD, ids=lambda v: json.dumps(v))
def test_a_good_value_of_each_form_renders_into_the_objects(values, value):
    assert value in json.dumps(render(values).objects)


def test_the_schema_holds_no_pattern_whose_message_would_be_a_regular_expression():
    """A `pattern` (or a `not`) fails with the expression (or "'not' failed") alone:
    each form is checked in templates/_validate.tpl instead."""
    text = (CHART / "values.schema.json").read_text()
    assert '"pattern"' not in text and '"not"' not in text


LAYOUTS = [
    "2x16GiB", "1x24GiB:A10,1x80GiB:A100", " 2 x 16 GiB ", "16", "2*16G", "4X8GB",
    "2x16GiB,,1x8GiB", "1x80GiB:A100 80GB", "016x1",
    "abc", "", " , ", "0x16GiB", "2x0GiB", "2x16GiB:", "2x16TiB", "x16GiB",
    "2x16GiB;1x8GiB", "-1x16GiB", "2x16GiB:A10,",
]  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
def test_the_chart_takes_exactly_the_mock_layouts_the_node_components_read(layout):
    """A layout the chart renders but the node components refuse would crash-loop the
    node pod; one it refuses that they read would refuse a good install."""
    try:
        parse_layout(layout)
        readable = True
    except ValueError:
        readable = False
    try:
        render({"gpu": {"backend": "mock", "mockGpus": layout}})
        rendered = True
    except helm.HelmRenderError as refused:
        assert "gpu.mockGpus" in str(refused) and LAYOUT_EXAMPLE in str(refused)
        rendered = False
    assert rendered == readable


def test_types_are_still_the_schemas_and_name_the_value():
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as refused:
        chart.validate_schema({"gpu": {"mockGpus": 2}})
    assert "at '/gpu/mockGpus': got number, want string" in str(refused.value)
