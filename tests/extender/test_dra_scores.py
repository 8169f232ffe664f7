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
    for other in (pod("ack", mem=4), pod("cpu-only"), pod("bad", mem=4, core=7), forged):
        created = cluster.create_pod(other)  # the extender need not have seen it
        scores = s.prioritize(created, ["a", "dp"], verb="prioritize-claims")
        assert scores == {"a": 0, "dp": 0}, other.metadata.name
