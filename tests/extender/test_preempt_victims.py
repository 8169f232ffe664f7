"""Preempt as kube-scheduler calls it: the scheduler offers victims chosen by the
node's sum of gpu-mem; the extender answers, per node, the cheapest lower-priority
pods whose eviction makes the pod fit GPU by GPU (docs/contracts.md#preempt)."""

from gpushare.objects import Pod
from tests.builders import node, pod
from tests.extender.harness import Scheduler, allocation_of, pod_json, wait_until

HIGH = 1000
SPLIT_IN_TWO = {"aliyun.com/gpu-count": "2"}


def fill(s: Scheduler, target: str, *pods: tuple[str, int, int, tuple[int, ...]], core=None):
    """Binds pods (name, GiB, priority, expected GPUs) to `target` in order (binpack
    packs the fullest GPU first) and checks they landed where the test says."""
    for name, mem, priority, gpus in pods:
        created = s.submit(pod(name, mem=mem, core=core and core[name], priority=priority))
        assert s.bind(created, target) == ""
        assert allocation_of(s.cluster, "default", name).gpu_indices == gpus


def preempt(s: Scheduler, preemptor: Pod, offered: dict[str, list[str]], pdbs: int = 0) -> dict:
    """The extender's answer to the scheduler's victims (pod names), as node → names."""
    victims = {
        name: {"Pods": [{"UID": f"uid-{v}"} for v in names], "NumPDBViolations": pdbs}
        for name, names in offered.items()
    }
    body = {"Pod": pod_json(preemptor), "NodeNameToVictims": None, "NodeNameToMetaVictims": victims}
    response = s.post("preempt", body)
    assert response.status_code == 200, response.text
    answer = response.json()["NodeNameToMetaVictims"]
    names = {}
    for name, meta in answer.items():
        assert meta["Pods"] and meta["NumPDBViolations"] == pdbs
        names[name] = {p["UID"].removeprefix("uid-") for p in meta["Pods"]}
    return names


def evict_then_schedule(s: Scheduler, preemptor: Pod, victims: set[str]) -> str | dict:
    for name in victims:
        s.cluster.delete_pod("default", name)
    wait_until(lambda: all(s.service.cache.pod(f"default/{v}") is None for v in victims))
    return s.schedule(s.submit(preemptor))


def test_two_pods_across_gpus_become_two_pods_of_one_gpu(cluster, scheduler_for):
    cluster.add_node(node("n", "2x16GiB,1x24GiB"))
    s = scheduler_for()
    on = {0: "ab", 1: "cd", 2: "efg"}
    fill(s, "n", *((name, 8, 0, (gpu,)) for gpu, names in on.items() for name in names))
    big = pod("big", mem=16, priority=HIGH)
    assert s.filter(big)["NodeNames"] == []
    victims = {"Pods": [{"UID": "uid-a"}, {"UID": "uid-c"}], "NumPDBViolations": 1}
    body = {"Pod": pod_json(big), "NodeNameToMetaVictims": {"n": victims}}
    answer = s.post("preempt", body).json()["NodeNameToMetaVictims"]
    assert answer["n"]["NumPDBViolations"] == 1
    chosen = {p["UID"].removeprefix("uid-") for p in answer["n"]["Pods"]}
    assert len(chosen) == 2 and any(chosen <= set(names) for names in on.values())
    assert evict_then_schedule(s, big, chosen) == "n"
    assert allocation_of(cluster, "default", "big").gpu_indices == (0,)


def test_pods_of_equal_priority_are_never_evicted(cluster, scheduler_for):
    cluster.add_node(node("n", "2x16GiB"))
    cluster.add_node(node("k", "1x16GiB"))
    s = scheduler_for()
    fill(s, "n", ("peer", 8, HIGH, (0,)), ("b", 8, 0, (0,)), ("c", 8, 0, (1,)), ("d", 8, 0, (1,)))
    fill(s, "k", ("peer2", 8, HIGH, (0,)), ("y", 8, 0, (0,)))
    big = pod("big", mem=16, priority=HIGH)
    answer = preempt(s, big, {"n": ["b", "c"], "k": ["peer2", "y"]})
    assert answer == {"n": {"c", "d"}}


def test_the_lowest_priorities_are_evicted_first(cluster, scheduler_for):
    cluster.add_node(node("n", "3x16GiB"))
    s = scheduler_for()
    fill(
        s,
        "n",
        *(("p", 8, 5, (0,)), ("q", 8, 5, (0,))),
        *(("r", 8, 1, (1,)), ("s", 8, 3, (1,))),
        *(("t", 8, 2, (2,)), ("u", 8, 4, (2,))),
    )
    big = pod("big", mem=16, priority=10)
    # The scheduler spares the most important pods while the node's sum still fits:
    # p, q, u and s stay; t and r, on two GPUs, go.
    assert preempt(s, big, {"n": ["t", "r"]}) == {"n": {"r", "s"}}
    assert evict_then_schedule(s, big, {"r", "s"}) == "n"


def test_compute_is_freed_where_memory_alone_would_not_do(cluster, scheduler_for):
    cluster.add_node(node("n", "2x16GiB", mode="core_mem"))
    s = scheduler_for()
    core = {"a": 30, "b": 60, "c": 60, "d": 30}
    fill(
        s,
        "n",
        *(("a", 8, 0, (0,)), ("b", 4, 2, (0,)), ("c", 8, 1, (1,)), ("d", 6, 3, (1,))),
        core=core,
    )
    big = pod("big", mem=8, core=50, priority=10)
    # Evicting a frees 8 GiB on GPU 0 but leaves 40% of its compute, not 50%.
    assert preempt(s, big, {"n": ["a"]}) == {"n": {"c"}}
    assert evict_then_schedule(s, big, {"c"}) == "n"


def test_a_pod_split_over_two_gpus_gets_room_on_two_gpus(cluster, scheduler_for):
    cluster.add_node(node("n", "3x16GiB"))
    s = scheduler_for()
    fill(
        s,
        "n",
        *(("a", 8, 0, (0,)), ("b", 8, 0, (0,)), ("c", 8, 0, (1,)), ("d", 8, 5, (1,))),
        ("e", 16, 1, (2,)),
    )
    big = pod("big", mem=16, labels=SPLIT_IN_TWO, priority=10)  # 8 GiB on each of 2 GPUs
    answer = preempt(s, big, {"n": ["a", "b"]})  # frees 16 GiB, all on GPU 0
    assert len(answer["n"]) == 2 and "c" in answer["n"] and answer["n"] & {"a", "b"}
    assert evict_then_schedule(s, big, answer["n"]) == "n"
    assert len(allocation_of(cluster, "default", "big").gpu_indices) == 2


def test_nodes_where_nothing_helps_are_dropped_and_empty_offers_answered(cluster, scheduler_for):
    cluster.add_node(node("n", "1x16GiB"))
    cluster.add_node(node("m", "1x16GiB"))
    cluster.add_node(node("k", "1x16GiB"))
    cluster.add_node(node("free", "1x16GiB"))
    s = scheduler_for()
    fill(s, "n", ("v1", 8, 0, (0,)), ("v2", 6, 0, (0,)))
    fill(s, "m", ("w", 12, 0, (0,)))
    fill(s, "k", ("peer", 12, HIGH, (0,)))
    big = pod("big", mem=10, priority=HIGH)
    answer = preempt(s, big, {"n": ["v2"], "m": [], "k": [], "free": [], "ghost": ["x"]})
    assert answer == {"n": {"v1"}, "m": {"w"}}


def test_the_schedulers_set_stands_when_it_suffices_else_the_cheaper_one(cluster, scheduler_for):
    for name in ("n", "m", "cpu"):
        cluster.add_node(node(name, "2x16GiB"))
    s = scheduler_for()
    fill(s, "n", ("a", 8, 0, (0,)), ("b", 8, 0, (0,)), ("c", 8, 0, (1,)), ("d", 8, 0, (1,)))
    fill(s, "m", ("e", 8, 0, (0,)), ("f", 8, 0, (0,)), ("g", 16, 0, (1,)))
    cpu_only = [{"name": "c", "resources": {"limits": {"cpu": "4"}}}]
    s.cluster.create_pod(pod("web", containers=cpu_only, node="cpu"))
    big = pod("big", mem=16, priority=HIGH)
    # n: the scheduler's c and d make room and cost what a and b would.
    # m: its e and f make room too, but cost two pods where g alone does.
    # cpu: the GPUs have room; what the scheduler frees is something else.
    offered = {"n": ["c", "d"], "m": ["e", "f"], "cpu": ["web"]}
    assert preempt(s, big, offered, pdbs=2) == {"n": {"c", "d"}, "m": {"g"}, "cpu": {"web"}}


def test_pods_being_deleted_are_not_evicted_again(cluster, scheduler_for):
    cluster.add_node(node("n", "2x16GiB"))
    s = scheduler_for()
    fill(s, "n", ("z", 8, 0, (0,)), ("a", 8, 0, (0,)), ("c", 8, 0, (1,)), ("d", 8, 0, (1,)))
    cluster.begin_pod_deletion("default", "z")  # its containers are stopping
    wait_until(lambda: s.service.cache.pod("default/z").deleting)
    assert s.filter(pod("small", mem=8, priority=HIGH))["NodeNames"] == []  # z holds GPU 0
    big = pod("big", mem=16, priority=HIGH)
    assert preempt(s, big, {"n": ["z", "c"]}) == {"n": {"a"}}


def test_full_victim_pods_are_read_when_not_node_cache_capable(cluster, scheduler_for):
    cluster.add_node(node("n", "2x16GiB"))
    s = scheduler_for()
    fill(s, "n", ("a", 8, 0, (0,)), ("b", 8, 0, (0,)), ("c", 8, 0, (1,)), ("d", 8, 0, (1,)))
    full = [pod_json(cluster.get_pod("default", name)) for name in ("a", "c")]
    body = {
        "Pod": pod_json(pod("big", mem=16, priority=HIGH)),
        "NodeNameToVictims": {"n": {"Pods": full, "NumPDBViolations": 0}},
        "NodeNameToMetaVictims": None,
    }
    answer = s.post("preempt", body).json()
    assert answer == {
        "NodeNameToMetaVictims": {
            "n": {"Pods": [{"UID": "uid-a"}, {"UID": "uid-b"}], "NumPDBViolations": 0}
        }
    }
