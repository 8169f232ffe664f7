"""kube-scheduler (1.28 still) uses the reasons and errors an extender returns as
printf format strings: a '%' in them reads "%!c(MISSING)" in the pod's events. So
no answer of the extender carries one, whatever the refusal."""

import re

from gpushare.cluster.memory import gpu_node
from gpushare.inventory import NODE_GPUS_ANNOTATION, Gpu, parse_layout
from gpushare.objects import Node, ObjectMeta
from tests.builders import container, node, pod

RULE = re.compile(r"\[([a-z0-9-]+)\]$")


def sick_node(name: str) -> Node:
    """One GPU, which the device plugin reports unhealthy."""
    gpus = tuple(
        Gpu(g.index, g.uuid, g.mem, g.model, g.core, healthy=False)
        for g in parse_layout("1x16GiB", name)
    )
    return gpu_node(name, gpus)


def broken_node(name: str) -> Node:
    """A GPU annotation the extender cannot read, with a '%' in it."""
    annotations = {NODE_GPUS_ANNOTATION: '[{"index": "50%", "uuid": "u", "memGiB": 16}]'}
    return node(name, "1x16GiB").model_copy(
        update={"metadata": ObjectMeta(name=name, annotations=annotations)}
    )


def test_no_reason_or_error_the_scheduler_reads_has_a_percent_sign(cluster, scheduler_for):
    for name, layout, mode in [
        ("small", "1x8GiB", "cgpu"),
        ("full-memory", "1x16GiB", "cgpu"),
        ("full-compute", "1x16GiB", "core_mem"),
        ("memory-jobs", "1x16GiB", "core_mem"),
        ("crowded", "1x80GiB", "cgpu"),
        ("two", "2x16GiB", "cgpu"),
        ("plain", "1x16GiB", None),
    ]:
        cluster.add_node(node(name, layout, mode=mode))
    cluster.add_node(sick_node("sick"))
    cluster.add_node(broken_node("broken"))
    s = scheduler_for(max_pods_per_gpu=1)
    for occupant, where in [
        (pod("hog", mem=14), "full-memory"),
        (pod("busy", mem=2, core=100), "full-compute"),
        (pod("memory-only", mem=2), "memory-jobs"),
        (pod("lodger", mem=1), "crowded"),
        (pod("slice", mem=1), "two"),
    ]:
        assert s.bind(s.submit(occupant), where) == ""
    asking = [
        pod("memory", mem=4),
        pod("compute", mem=2, core=10),
        pod("large", mem=12),
        pod("split", mem=4, labels={"aliyun.com/gpu-count": "4"}),
        pod("whole", count=2),
        pod("pair", containers=[container("a", 10), container("b", 10)]),
        pod("odd-core", mem=2, core=33),
    ]

    reasons = []
    for asked in asking:
        answer = s.filter(s.submit(asked), [*s.node_names(), "ghost"])
        reasons += [answer["Error"], *answer["FailedNodes"].values()]
        reasons += answer["FailedAndUnresolvableNodes"].values()
    reasons.append(s.bind(s.cluster.get_pod("default", "compute"), "full-compute"))

    assert [reason for reason in reasons if "%" in reason] == []
    rules = {match.group(1) for reason in reasons if (match := RULE.search(reason))}
    assert rules >= {
        "insufficient-gpu-memory",
        "insufficient-gpu-core",
        "pods-per-gpu-limit",
        "job-type-mixing",
        "node-mode-no-compute",
        "too-few-gpus",
        "gpu-too-small",
        "no-free-whole-gpu",
        "containers-do-not-fit-together",
        "unhealthy-gpus",
        "node-not-gpu-shared",
        "node-unknown",
        "core-multiple-of-5",
    }, rules
    assert any("needs 2 GiB + 10 percent compute" in reason for reason in reasons), reasons
    assert any("does not fit any more" in reason for reason in reasons), reasons
