"""DRA mode's node scores over HTTP, as kube-scheduler calls the second extender entry
(prioritize-claims, no managedResources): a pod the webhook rewrote to a claim is scored
as its ACK request would be, against the books that charge what kube-scheduler bound."""

from gpushare.cluster.memory import MemoryCluster
from gpushare.dra.ackresources import ACK_RESOURCES
from gpushare.objects import Node, Pod
from tests.builders import node, pod
from tests.dra.rewrite import rewritten
from tests.extender.harness import wait_until


def dra_node(name: str, layout: str = "2x16GiB") -> Node:
    """A node of the DRA driver: its GPU annotation and mode label, no aliyun.com resources."""
    made = node(name, layout)
    return made.model_copy(
        update={"status": made.status.model_copy(update={"allocatable": {}, "capacity": {}})}
    )


def _bound_there(cluster: MemoryCluster, p: Pod, node_name: str) -> Pod:
    """The pod as kube-scheduler leaves it: bound, no allocation record yet."""
    return cluster.create_pod(
        p.model_copy(update={"spec": p.spec.model_copy(update={"node_name": node_name})})
    )


def test_a_claim_pod_is_scored_toward_the_node_its_books_show_fuller(cluster, scheduler_for):
    cluster.add_node(dra_node("a"))
    cluster.add_node(dra_node("b"))
    s = scheduler_for()
    first = _bound_there(cluster, rewritten(pod("first", mem=4)), "a")
    wait_until(lambda: s.service.cache.node_details("a").gpus[0].allocated_mem == 4, what="charged")

    second = s.submit(rewritten(pod("second", mem=4)))
    scores = s.prioritize(second, ["a", "b"], verb="prioritize-claims")
    assert scores["a"] > scores["b"] and all(0 <= v <= 10 for v in scores.values())
    # The first entry's verb sees no aliyun.com resource on it: no opinion.
    assert set(s.prioritize(second, ["a", "b"]).values()) == {0}
    assert first.spec.node_name == "a"


def test_pods_that_are_not_rewritten_claim_pods_score_zero_everywhere(cluster, scheduler_for):
    cluster.add_node(dra_node("a"))
    cluster.add_node(node("dp"))  # a device-plugin node: its pods are the first entry's
    s = scheduler_for()
    _bound_there(cluster, rewritten(pod("busy", mem=8)), "a")
    small = rewritten(pod("forged", mem=1))
    said = {**small.metadata.annotations, ACK_RESOURCES: '{"main":{"aliyun.com/gpu-mem":"14"}}'}
    forged = small.model_copy(
        update={"metadata": small.metadata.model_copy(update={"annotations": said})}
    )
    breaking = rewritten(pod("breaks", mem=4, core=30))  # its annotation says 33 percent
    said = {
        **breaking.metadata.annotations,
        ACK_RESOURCES: '{"main":{"aliyun.com/gpu-core.percentage":"33","aliyun.com/gpu-mem":"4"}}',
    }
    breaking = breaking.model_copy(
        update={"metadata": breaking.metadata.model_copy(update={"annotations": said})}
    )
    others = (pod("ack", mem=4), pod("cpu-only"), pod("bad", mem=4, core=7), forged, breaking)
    for other in others:
        created = cluster.create_pod(other)  # the extender need not have seen it
        scores = s.prioritize(created, ["a", "dp"], verb="prioritize-claims")
        assert scores == {"a": 0, "dp": 0}, other.metadata.name


def test_a_claim_pod_is_read_once_into_what_placement_needs(cluster):
    from gpushare.extender.cache import SchedulerCache
    from gpushare.extender.pendingpod import PendingPod
    from gpushare.request import parse_pod_request

    ask = pod(
        "asks", mem=4, namespace="ml", priority=7,
        annotations={"gpushare.io/placement-policy": "binpack"},
    )  # fmt: skip
    pending = SchedulerCache().claim_pending(rewritten(ask))
    assert pending == PendingPod("ml/asks", "uid-asks", parse_pod_request(ask), "binpack", 7)
    unprioritized = SchedulerCache().claim_pending(rewritten(pod("plain", mem=4)))
    assert unprioritized is not None and unprioritized.priority == 0
    assert unprioritized.policy is None


def test_scoring_a_claim_pod_teaches_its_policy_the_pod_once(cluster, scheduler_for):
    from gpushare.placement.lookahead import LookaheadFgdPolicy
    from gpushare.placement.workload import TaskShape
    from tests.extender.test_workload_policy import registry_with

    learning = LookaheadFgdPolicy()
    cluster.add_node(dra_node("a"))
    cluster.add_node(dra_node("b"))
    s = scheduler_for(default_placement=learning.name, policies=registry_with(learning))
    epoch = learning.epoch
    for i in range(10):  # pods that name binpack teach the default nothing
        named = pod(f"b{i}", mem=9, annotations={"gpushare.io/placement-policy": "binpack"})
        s.prioritize(s.submit(rewritten(named)), ["a", "b"], verb="prioritize-claims")
    assert learning.epoch == epoch
    for i in range(40):
        claimed = s.submit(rewritten(pod(f"p{i}", mem=4)))
        s.prioritize(claimed, ["a", "b"], verb="prioritize-claims")
        s.prioritize(claimed, ["a", "b"], verb="prioritize-claims")  # a retry: learned once
    assert learning.epoch > epoch
    assert dict(learning.workload.tasks)[TaskShape(gpus=1, mem=4)] > 0.5
