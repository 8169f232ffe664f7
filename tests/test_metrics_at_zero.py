"""Every labelled series of every component exists before its first event, at 0, for
every label value the code can emit.

Prometheus's increase() starts from a series' first sample, so a counter born at 1 by
its first event shows no increase: a first refusal, a first webhook error, a first
rejection by a rule would go unseen. The test walks every labelled metric of each
component's registry (the extender's, the device plugin's with one pod bound to its node,
the isolation agent's with one container published), those its collectors make at
scrape time from what it holds included, and asks for the series of every combination
of its label values, where each label's values come from the enum or tuple the code
emits them from. A new labelled metric fails here until its series are created at
construction and its labels' sources are named below.

A container's series are per-container series too: the device plugin's exist from the
moment its pod is bound to the node, before the kubelet admits it or any process of it
touches a GPU (the agent's begin only with its first GPU process).
"""

import itertools
from collections.abc import Iterable, Mapping

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from gpushare import annotation
from gpushare.deviceplugin.metrics import (
    CONTAINER_LABELS,
    AllocateResult,
    Call,
    PluginMetrics,
    Refusal,
)
from gpushare.draplugin.metrics import DriverMetrics, Outcome
from gpushare.errors import Rule
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.metrics import (
    ALLOWED,
    BindResult,
    EventDrop,
    ExtenderMetrics,
    RequeueResult,
    Verb,
    Webhook,
)
from gpushare.isolation.interposer.region import Refusal as RegionRefusal
from gpushare.isolation.memory import MemoryAction
from gpushare.isolation.metrics import CONTAINER_LABELS as AGENT_CONTAINER_LABELS
from gpushare.isolation.metrics import AgentMetrics
from gpushare.isolation.policy import Policy
from gpushare.isolation.treecodec import FILE_NAMES, ContainerEntry, GpuEntry, TreeContent
from gpushare.placement.fit import Assignment, to_allocation
from gpushare.request import parse_pod_request
from gpushare.resources import MANAGED_RESOURCES
from tests.builders import T0, container, inventory, node, pod

NODE = "gpu-node-1"

SOURCES: Mapping[tuple[str, str], Iterable[str]] = {
    # (metric, label): where the code takes the label's values from
    ("gpushare_extender_request_duration_seconds", "verb"): [*Verb, *Webhook],
    ("gpushare_extender_binds", "result"): BindResult,
    ("gpushare_extender_filter_rejections", "rule"): Rule,
    ("gpushare_extender_requeues", "result"): RequeueResult,
    ("gpushare_extender_events_dropped", "reason"): EventDrop,
    ("gpushare_admission_reviews", "webhook"): Webhook,
    ("gpushare_admission_reviews", "allowed"): ALLOWED,
    ("gpushare_admission_errors", "webhook"): Webhook,
    ("gpushare_device_plugin_allocate", "result"): AllocateResult,
    ("gpushare_device_plugin_allocation_failures", "reason"): Refusal,
    ("gpushare_device_plugin_answer_timeouts", "call"): Call,
    ("gpushare_isolation_memory_cap_violations", "action"): MemoryAction,
    ("gpushare_isolation_memory_backstop_actions", "action"): MemoryAction,
    ("gpushare_isolation_region_distrusted", "reason"): RegionRefusal,
    ("gpushare_isolation_control_writes_refused", "file"): FILE_NAMES,
    ("gpushare_dra_plugin_prepares", "outcome"): Outcome,
}
"""Labels whose values are a fixed set, by metric."""

CONTAINER = ContainerEntry(
    id="containerd-4f1c",
    pod="team-a/infer-0",
    name="server",
    memsize=4 << 30,
    processes=(),
    weight=1,
    highprio=False,
    util=None,
    limit=None,
    violations=0,
)
INSTANCE: Mapping[str, Iterable[str]] = {
    "node": [NODE],
    "resource": MANAGED_RESOURCES,
    "gpu": ["0"],
    "uuid": [gpu.uuid for gpu in inventory("1x16GiB:T4", NODE).gpus],
    "model": ["T4"],
    "namespace": ["team-a"],
    "pod": ["infer-0"],
    "container": ["server"],
    "container_id": ["containerd-4f1c"],
}
"""Labels that name what the component serves: its node, its resources, its GPU and the
container bound to it (the plugin) or published (the agent)."""


def extender() -> CollectorRegistry:
    """The extender of a cluster of one GPU node: its per-node and per-GPU series too
    (gpushare_scheduler_node_unknown_allocations at 0 among them)."""
    cache = SchedulerCache()
    cache.replace_nodes([node(NODE, "1x16GiB:T4")])
    cache.replace_pods([])
    return ExtenderMetrics(cache).registry


def device_plugin() -> CollectorRegistry:
    """The plugin of a node with one T4, and one pod bound to it that the kubelet has not
    admitted yet."""
    gpus = inventory("1x16GiB:T4", NODE)
    bound = pod("infer-0", namespace="team-a", containers=[container("server", 4)], node=NODE)
    request = parse_pod_request(bound)
    assert request is not None
    allocation = to_allocation(request, Assignment(((0,),), ()), gpus, T0)
    bound = bound.model_copy(
        update={
            "metadata": bound.metadata.model_copy(
                update={"annotations": annotation.encode(allocation)}
            )
        }
    )
    metrics = PluginMetrics(NODE)
    metrics.watch_gpus(lambda: gpus.gpus, lambda: [(bound, allocation)])
    return metrics.registry


def agent() -> CollectorRegistry:
    metrics = AgentMetrics(NODE)
    metrics.configure([0], 0.1, MemoryAction.KILL)
    gpu = GpuEntry(0, "GPU-0", "T4", 16 << 30, Policy.FIXED, 16, 3, 16, 195, 0.0, (CONTAINER,))
    metrics.publish(TreeContent("test", 0, (gpu,)))
    return metrics.registry


def dra_driver() -> CollectorRegistry:
    """The DRA driver of a node whose GPU 0 holds one prepared claim's 4 GiB."""
    return DriverMetrics(NODE, lambda: {0: (4, 0, 1)}).registry


COMPONENTS = [extender, device_plugin, agent, dra_driver]


def _labelled(registry: CollectorRegistry) -> list[tuple[str, str, tuple[str, ...]]]:
    """(name, type, label names) of every labelled metric: those made at construction,
    and the families collectors make at each scrape from what the component holds (those
    with samples: an extender that knows no node has no GPU to report)."""
    found = []
    for collector in registry._collector_to_names:  # prometheus-client keeps no public list
        if isinstance(collector, MetricWrapperBase):
            found.append((collector._name, collector._type, collector._labelnames))
        else:
            found += [(f.name, f.type, f._labelnames) for f in collector.collect() if f.samples]
    return [(name, kind, labels) for name, kind, labels in found if labels]


def _values(metric: str, label: str) -> list[str]:
    source = SOURCES.get((metric, label), INSTANCE.get(label))
    if source is None:
        pytest.fail(
            f"{metric}: where do the values of its label {label!r} come from? Create its "
            "series at construction and name the source in SOURCES"
        )
    return [str(value) for value in source]


@pytest.mark.parametrize("registry_of", COMPONENTS, ids=lambda f: f.__name__)
def test_every_labelled_series_exists_from_the_start(registry_of):
    registry = registry_of()
    labelled = _labelled(registry)
    assert labelled, "no labelled metric found: the walk is wrong"
    missing = []
    for name, kind, labels in labelled:
        first = {"counter": "_total", "histogram": "_count"}.get(kind, "")
        for values in itertools.product(*(_values(name, label) for label in labels)):
            value = registry.get_sample_value(name + first, dict(zip(labels, values, strict=True)))
            if value is None or (first and value != 0):
                missing.append(f"{name}{dict(zip(labels, values, strict=True))} = {value}")
    assert missing == []


def test_a_counter_created_without_its_series_is_found():
    """The walk itself: a labelled counter nobody pre-created fails it."""
    from prometheus_client import Counter

    registry = agent()
    Counter("gpushare_isolation_new_thing", "new", ["node"], registry=registry)
    with pytest.raises(AssertionError, match="gpushare_isolation_new_thing"):
        test_every_labelled_series_exists_from_the_start(lambda: registry)


def test_a_container_bound_to_the_node_has_its_series_before_its_first_gpu_process():
    """The device plugin's per-container series (what the dashboard's per-container panels
    fall back to while the agent has seen no process of the container) carry the agent's
    container labels, less container_id."""
    registry = device_plugin()
    per_container = {name for name, _, labels in _labelled(registry) if "container" in labels}
    assert per_container == {
        "gpushare_container_memory_allocated_bytes",
        "gpushare_container_core_allocated_percent",
        "gpushare_container_assigned",
    }
    labels = dict(zip(CONTAINER_LABELS, [NODE, "0", "team-a", "infer-0", "server"], strict=True))
    assert registry.get_sample_value("gpushare_container_memory_allocated_bytes", labels) == 4 << 30
    assert registry.get_sample_value("gpushare_container_assigned", labels) == 0
    assert set(CONTAINER_LABELS) | {"container_id"} == set(AGENT_CONTAINER_LABELS)
