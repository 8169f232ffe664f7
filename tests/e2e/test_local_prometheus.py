"""On the real cluster, a real Prometheus (Debian's `prometheus` binary, on loopback)
scrapes the extender's operational port, the device plugin and the isolation agent every
second and evaluates the chart's alert rules (helm/gpushare/files/alerts.yaml) every
second, with each alert's `for` rewritten to 2 s by the harness (tests/prometheus.py):
the expressions are the shipped ones.

The scenarios provoke what the alerts are for and read Prometheus's own rule evaluation
(GET /api/v1/alerts): a refused pod and an unplaceable one, the device plugin stopped,
a GPU unhealthy, a malformed AdmissionReview, a container over its memory cap (the
agent on the fake NVML for that test); each cause is undone afterwards. The module ends
by running every panel query of the Grafana dashboard over what was scraped: each
returns data.
"""

import json
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare.inventory import parse_layout
from gpushare.isolation.backends.port import GIB
from tests.e2e.kube import wait_for
from tests.e2e.local import (
    AGENT_METRICS_PORT,
    EXTENDER_OPS_PORT,
    GPU_SIZES,
    MOCK_GPUS,
    NODE,
    PLUGIN_METRICS_PORT,
    WEBHOOK_PORT,
    HostProcess,
    LocalCluster,
)
from tests.e2e.workloads import WORKLOAD_LABEL, busybox_pod
from tests.fakenvml import (
    FakeGpu,
    FakeNvmlUnavailable,
    FakeProcess,
    World,
    build_fake_nvml,
    nvml_env,
    write_world,
)
from tests.prometheus import (
    ALERTS,
    PrometheusServer,
    PrometheusUnavailable,
    Target,
    rules_with_for,
)

pytestmark = [
    pytest.mark.realcluster,
    pytest.mark.timeout(300),
    pytest.mark.usefixtures("clean_workloads"),
]

DASHBOARD = Path(ALERTS).with_name("dashboard.json")
HOLD = "2s"
"""Every alert's `for` in this module: pending at the first evaluation, firing 2 s on."""
JOBS = ("gpushare-extender", "gpushare-device-plugin", "gpushare-isolation")


@pytest.fixture(scope="module")
def prometheus(
    local: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    directory = tmp_path_factory.mktemp("prometheus")
    rules = rules_with_for(ALERTS, directory / "alerts.yaml", HOLD)
    targets = [
        Target("gpushare-extender", f"127.0.0.1:{EXTENDER_OPS_PORT}"),
        Target("gpushare-device-plugin", f"127.0.0.1:{PLUGIN_METRICS_PORT}", honor_labels=True),
        Target("gpushare-isolation", f"127.0.0.1:{AGENT_METRICS_PORT}", honor_labels=True),
    ]
    try:
        server = PrometheusServer(directory, targets, rules).start()
    except PrometheusUnavailable as err:
        pytest.skip(str(err))
    try:
        wait_for(
            "Prometheus to scrape all three components",
            lambda: server.target_health() == dict.fromkeys(JOBS, "up"),
            timeout=30,
            every=0.5,
        )
        yield server
    finally:
        server.stop()
        print(f"\nPrometheus log: {server.log}")


def active(prometheus: PrometheusServer, name: str, **labels: str) -> list[dict[str, Any]]:
    """The alert's pending or firing instances whose labels include `labels`."""
    return [
        a
        for a in prometheus.alerts()
        if a["labels"]["alertname"] == name and labels.items() <= a["labels"].items()
    ]


def wait_firing(prometheus: PrometheusServer, name: str, **labels: str) -> dict[str, Any]:
    def firing() -> dict[str, Any] | None:
        found = [a for a in active(prometheus, name, **labels) if a["state"] == "firing"]
        return found[0] if found else None

    try:
        alert = wait_for(f"{name} {labels} firing", firing, timeout=60, every=0.5)
    except AssertionError as err:
        raise AssertionError(f"{err}\nactive alerts: {prometheus.alerts()}") from None
    assert alert["annotations"]["runbook_url"].endswith("#" + name.lower())
    return alert


def wait_resolved(prometheus: PrometheusServer, name: str, **labels: str) -> None:
    wait_for(
        f"{name} {labels} resolved",
        lambda: not active(prometheus, name, **labels),
        timeout=60,
        every=0.5,
    )


def increase_since(prometheus: PrometheusServer, selector: str, since: float) -> float:
    """How much the counters `selector` grew from `since` to now, summed."""
    window = round(time.time() - since) + 5
    result = prometheus.query(f"sum(increase({selector}[{window}s]))")
    return float(result[0]["value"][1]) if result else 0.0


def test_the_first_refusal_and_the_first_filter_rejection_are_counted(
    local: LocalCluster, prometheus: PrometheusServer
):
    """Counted from 0: series that appeared with the first event would show no increase,
    and a dashboard or an alert on them would miss it."""
    time.sleep(3)  # a few scrapes before the events
    since = time.time()
    refused = local.create([busybox_pod("refused", 2, 33)], check=False)
    assert refused.returncode != 0 and "core-multiple-of-5" in refused.stderr
    local.create([busybox_pod("too-big", max(GPU_SIZES) + 1)])  # no single GPU holds it
    wait_for(
        "too-big refused by the extender",
        lambda: any(e["reason"] == "FailedScheduling" for e in local.events_for("too-big")),
        timeout=60,
        every=0.5,
    )
    alert = wait_firing(prometheus, "GpusharePodsUnplaceable")
    assert float(alert["value"]) == 1  # the pod refused at admission never reached it
    local.kubectl("delete", "pod", "too-big", "--wait=true")
    wait_for(
        "the admission refusal counted",
        lambda: (
            increase_since(prometheus, 'gpushare_admission_reviews_total{allowed="false"}', since)
            >= 1
        ),
        timeout=15,
        every=1,
    )
    wait_for(
        "the filter rejection counted",
        lambda: increase_since(prometheus, "gpushare_extender_filter_rejections_total", since) >= 1,
        timeout=15,
        every=1,
    )
    wait_resolved(prometheus, "GpusharePodsUnplaceable")


def test_a_stopped_device_plugin_fires_not_registered_until_it_is_back(
    local: LocalCluster, prometheus: PrometheusServer
):
    assert local.plugin is not None
    local.plugin.stop()
    try:
        alert = wait_firing(prometheus, "GpushareDevicePluginNotRegistered", node=NODE)
        assert NODE in alert["annotations"]["summary"]
    finally:
        local.start_plugin()
    wait_resolved(prometheus, "GpushareDevicePluginNotRegistered")


def test_an_unhealthy_gpu_fires_until_it_heals(local: LocalCluster, prometheus: PrometheusServer):
    local.health_file.write_text("1\n")
    try:
        alert = wait_firing(prometheus, "GpushareGpuUnhealthy", node=NODE, gpu="1")
        assert f"GPU 1 of node {NODE}" in alert["annotations"]["summary"]
        assert [a["labels"]["gpu"] for a in active(prometheus, "GpushareGpuUnhealthy")] == ["1"]
    finally:
        local.health_file.write_text("")
    wait_for(
        "GPU 1 back in allocatable",
        lambda: local.allocatable("aliyun.com/gpu-mem") == sum(GPU_SIZES),
        timeout=60,
        every=1,
    )
    wait_resolved(prometheus, "GpushareGpuUnhealthy")


def test_a_malformed_admission_review_fires_webhook_errors(
    local: LocalCluster, prometheus: PrometheusServer
):
    """What a client other than the API server may send the webhook port: an error
    status, not an answer, counted. (It resolves 5 minutes on: promtool tests that.)"""
    request = urllib.request.Request(
        f"https://127.0.0.1:{WEBHOOK_PORT}/validate",
        data=b'{"kind": "AdmissionReview", "request": ',
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    context = ssl.create_default_context(cadata=local.ca_pem.decode())
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, context=context, timeout=10)
    assert 400 <= answer.value.code < 500
    alert = wait_firing(prometheus, "GpushareWebhookErrors", webhook="validate")
    assert active(prometheus, "GpushareWebhookErrors", webhook="mutate") == []
    assert "validate" in alert["annotations"]["summary"]


@pytest.fixture
def nvml_agent(local: LocalCluster) -> Iterator[World]:
    """The isolation agent on the fake NVML (the mock backend's containers hold no
    memory), over a world of the mock GPUs the device plugin advertises, reporting
    containers over their cap instead of killing them. The mock agent comes back after."""
    try:
        library = build_fake_nvml(local.our_dir / "fakenvml")
    except FakeNvmlUnavailable as err:
        pytest.skip(str(err))
    world = World(
        [
            FakeGpu(g.uuid, g.model, g.mem * GIB, minor=g.index)
            for g in parse_layout(MOCK_GPUS, NODE)
        ]
    )
    path = local.our_dir / "prometheus-nvml-world"
    write_world(path, world)
    mock = local.agent
    assert mock is not None
    agent = HostProcess(
        "isolation agent (nvml, report)",
        [str(local.venv_bin / "gpushare-isolation"), "--node-name", NODE, "--backend", "nvml",
         "--control-dir", str(local.control_dir), "--metrics-port", str(AGENT_METRICS_PORT),
         "--memory-action", "report"],
        local.logs / "gpushare-isolation-nvml-report.log",
        env=nvml_env(library, path, base={}),
    )  # fmt: skip
    mock.stop()
    local.agent = agent.start()
    try:
        yield world
        world.gpus = [FakeGpu(g.uuid, g.name, g.total_bytes, minor=g.minor) for g in world.gpus]
        write_world(path, world)
    finally:
        agent.stop()
        local.agent = mock.start()


def _container_pid(name: str) -> tuple[int, str] | None:
    """The host PID of the pod's container process and the GPU UUID it was given (found
    by the HOSTNAME a pod gets)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = dict(
                item.split("=", 1)
                for item in (entry / "environ").read_text(errors="replace").split("\0")
                if "=" in item
            )
        except OSError:
            continue
        if environ.get("HOSTNAME") == name and "ALIYUN_COM_GPU_MEM_IDX" in environ:
            return int(entry.name), environ["NVIDIA_VISIBLE_DEVICES"]
    return None


def test_a_container_over_its_memory_cap_fires(
    local: LocalCluster, prometheus: PrometheusServer, nvml_agent: World
):
    local.create([busybox_pod("over-cap", 2)])
    local.wait_running(WORKLOAD_LABEL, 1, timeout=60)
    pid, uuid = wait_for("the container's process", lambda: _container_pid("over-cap"), 10, 0.2)
    [gpu] = [g for g in nvml_agent.gpus if g.uuid == uuid]
    gpu.processes = [FakeProcess(pid, used_bytes=3 * 1024**3)]
    write_world(local.our_dir / "prometheus-nvml-world", nvml_agent)
    alert = wait_firing(prometheus, "GpushareContainerOverMemoryCap", node=NODE, pod="over-cap")
    assert alert["labels"]["namespace"] == "default"
    assert "over-cap" in alert["annotations"]["summary"]


def _panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target (in collapsed rows too), each of
    Grafana's variables set to its "All" value, as the dashboard opens."""
    dashboard = json.loads(DASHBOARD.read_text())
    everything = {
        v["name"]: v.get("allValue") or ".*"
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    }
    variable = re.compile(r"\$\{?(\w+)\}?")
    panels = [panel for top in dashboard["panels"] for panel in [top, *top.get("panels", [])]]
    queries = []
    for panel in panels:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m").replace("$__interval", "2s")
            expr = variable.sub(lambda m: everything.get(m.group(1), m.group(0)), expr)
            assert "$" not in expr, f"{panel['title']}: a variable the test does not set: {expr}"
            queries.append((panel["title"], expr))
    return queries


def test_every_dashboard_panel_query_returns_data(prometheus: PrometheusServer):
    """Run last: over everything the scenarios above made the components export."""
    step = 2
    now = time.time()
    # The grid ends at now, so its last point's windows hold every sample scraped: a rate
    # over a container that lived 3 s (2-3 samples) is empty at the points before its
    # second sample, and a grid from started_at may end just before it.
    start = now - step * ((now - prometheus.started_at) // step)
    empty = [
        f"{title}: {expr}"
        for title, expr in _panel_queries()
        if not prometheus.query_range(expr, start, now, step)
    ]
    assert empty == []
