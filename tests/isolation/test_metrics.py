"""The agent's metrics on their own: a container's labels, and counters that follow the
cumulative counts of the interposer's region."""

from gpushare.isolation.interposer.region import GpuUsage
from gpushare.isolation.memory import MemoryAction
from gpushare.isolation.metrics import AgentMetrics, container_labels
from gpushare.isolation.policy import Policy
from gpushare.isolation.treecodec import ContainerEntry, GpuEntry, TreeContent


def entry(pod: str, violations: int = 0) -> ContainerEntry:
    return ContainerEntry("4f1c", pod, "server", 0, (), 1, False, None, None, violations)


def content(*containers: ContainerEntry) -> TreeContent:
    gpu = GpuEntry(0, "GPU-0", "T4", 16 << 30, Policy.FIXED, 16, 3, 16, 195, 0.0, containers)
    return TreeContent("test", 0, (gpu,))


def usage(launches_held: int, refused: int) -> GpuUsage:
    return GpuUsage(0, "", 0, 0, True, 0, 0, launches_held, 0, 0, refused)


def test_a_pods_namespace_and_name_are_labels_of_their_own():
    assert container_labels("n", 1, entry("team-a/infer-0")) == (
        "n", "1", "team-a", "infer-0", "server", "4f1c"
    )  # fmt: skip
    # A pod the agent could not name keeps what it shows, with no namespace.
    assert container_labels("n", 0, entry("uid:8d2e"))[2:4] == ("", "uid:8d2e")


def test_counters_grow_by_what_the_region_counted_since_and_start_again_with_a_new_region():
    metrics = AgentMetrics("n")
    metrics.configure([0], 0.1, MemoryAction.REPORT)
    labels = dict(zip(["node", "gpu", "namespace", "pod", "container", "container_id"],
                      container_labels("n", 0, entry("a/b")), strict=True))  # fmt: skip

    def sample(name: str, **extra: str) -> float | None:
        return metrics.registry.get_sample_value(name, {**labels, **extra})

    for launches, refused in ((2, 1), (5, 1), (1, 0)):  # the last: a region made anew
        metrics.publish(
            content(entry("a/b", violations=1)), {("4f1c", 0): usage(launches, refused)}
        )
    assert sample("gpushare_isolation_launches_held_total") == 5 + 1
    assert sample("gpushare_isolation_allocations_refused_total") == 1
    assert sample("gpushare_isolation_memory_cap_violations_total", action="report") == 1
    assert sample("gpushare_isolation_memory_cap_violations_total", action="kill") == 0

    metrics.publish(content())  # forgotten: its series go
    assert sample("gpushare_isolation_launches_held_total") is None
