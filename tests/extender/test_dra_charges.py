"""DRA mode in the extender's books: a pod kube-scheduler bound with a claim is charged
where the allocator put it (the first GPUs with room, by index) until the driver's
record says where it is; a pod whose annotation its claim does not back is not."""

from gpushare import annotation
from gpushare.cluster import EventType
from gpushare.dra.ackresources import ACK_RESOURCES
from gpushare.extender.mirror import ClusterMirror, interesting
from gpushare.objects import Pod
from gpushare.placement.fit import Assignment, to_allocation
from tests.builders import T0, pod, request
from tests.dra.rewrite import rewritten
from tests.extender.test_rooms import Told, mirror


def _bound(p: Pod, node: str = "a") -> Pod:
    return p.model_copy(update={"spec": p.spec.model_copy(update={"node_name": node})})


def _with(p: Pod, **annotations: str) -> Pod:
    merged = {**p.metadata.annotations, **annotations}
    return p.model_copy(update={"metadata": p.metadata.model_copy(update={"annotations": merged})})


def _on_gpus(m: ClusterMirror, node: str = "a") -> list[dict[str, int]]:
    """Per GPU of the node, the memory each pod holds there."""
    return [{p.key: p.mem for p in g.pods} for g in m.details(node, with_pods=True).gpus]


def two_gpu_mirror() -> ClusterMirror:
    from tests.builders import node

    m = mirror(Told())
    m.replace_nodes([node("a", "2x16GiB"), node("b", "2x16GiB")])
    return m


def _recorded(m: ClusterMirror, name: str, mem: int, gpu: int) -> Pod:
    """A pod bound to node a whose record (the driver's) puts it on GPU `gpu`."""
    placed = Assignment(gpus=((gpu,),), added=((gpu, mem, 0),))
    record = to_allocation(request(mem=mem), placed, m.state.nodes["a"].inventory, T0)
    return _with(_bound(pod(name)), **annotation.encode(record))


def test_a_bound_claim_pod_is_charged_on_the_first_gpu_with_room():
    m = two_gpu_mirror()
    m.apply_pod(EventType.ADDED, _recorded(m, "half", 8, gpu=0))
    m.apply_pod(EventType.ADDED, _recorded(m, "most", 12, gpu=1))
    # Best fit (and our policies) would complete GPU 1; the allocator takes GPU 0.
    m.apply_pod(EventType.ADDED, _bound(rewritten(pod("dra", mem=4))))
    assert _on_gpus(m) == [{"default/half": 8, "default/dra": 4}, {"default/most": 12}]


def test_an_unbound_claim_pod_holds_nothing_yet():
    m = two_gpu_mirror()
    record = m.apply_pod(EventType.ADDED, rewritten(pod("waiting", mem=4)))
    assert record is not None and record.claim_request is None
    assert _on_gpus(m) == [{}, {}]


def test_the_drivers_record_replaces_the_charge_and_the_charge_stays_put_until_then():
    m = two_gpu_mirror()
    m.apply_pod(EventType.ADDED, _recorded(m, "ten", 10, gpu=0))
    dra = _bound(rewritten(pod("dra", mem=4)))
    m.apply_pod(EventType.ADDED, dra)
    # A status update: the charge stays where it is (counted against itself, GPU 0
    # would look too full for it now).
    m.apply_pod(EventType.MODIFIED, dra)
    assert _on_gpus(m) == [{"default/ten": 10, "default/dra": 4}, {}]
    driver = _with(dra, **_recorded(m, "dra", 4, gpu=1).metadata.annotations)
    m.apply_pod(EventType.MODIFIED, driver)
    assert _on_gpus(m) == [{"default/ten": 10}, {"default/dra": 4}]
    m.apply_pod(EventType.DELETED, dra)
    assert _on_gpus(m) == [{"default/ten": 10}, {}]


def test_a_listing_charges_claim_pods_after_every_record():
    m = two_gpu_mirror()
    recorded = _recorded(m, "recorded", 14, gpu=0)
    # Listed before the record that fills GPU 0: it must still go to GPU 1.
    m.replace_pods([_bound(rewritten(pod("dra", mem=4))), recorded])
    assert _on_gpus(m) == [{"default/recorded": 14}, {"default/dra": 4}]


def test_an_annotation_the_claim_does_not_back_is_not_charged():
    m = two_gpu_mirror()
    forged = _with(
        _bound(rewritten(pod("small", mem=1))),
        **{ACK_RESOURCES: '{"main":{"aliyun.com/gpu-mem":"14"}}'},
    )
    assert interesting(forged)
    record = m.apply_pod(EventType.ADDED, forged)
    assert record is not None and record.claim_request is None
    assert _on_gpus(m) == [{}, {}]


def test_a_claim_that_fits_nowhere_on_its_node_is_not_charged():
    m = two_gpu_mirror()
    for name in ("x", "y"):
        m.apply_pod(EventType.ADDED, _bound(rewritten(pod(name, mem=12))))
    m.apply_pod(EventType.ADDED, _bound(rewritten(pod("late", mem=8))))
    assert _on_gpus(m) == [{"default/x": 12}, {"default/y": 12}]
