"""Properties over random clusters and pod streams: no GPU over its memory or
compute, never more pods on a GPU than allowed, no job-type mixing, every
refusal explained, and the state rebuilt from annotations equal to the live one."""

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare import annotation
from gpushare.allocation import PodAllocation
from gpushare.errors import PodRefused, Refusal
from gpushare.inventory import Gpu, NodeGpus
from gpushare.labels import NodeMode
from gpushare.objects import Pod
from gpushare.placement.fit import Placement, evaluate, to_allocation
from gpushare.placement.policies import POLICIES
from gpushare.request import ContainerRole, JobType, parse_pod_request
from gpushare.state import ClusterState
from tests.builders import T0, container, node, pod

gpu_sizes = st.sampled_from([4, 8, 16, 24, 40, 80])


@st.composite
def inventories(draw) -> list[NodeGpus]:
    nodes = []
    for n in range(draw(st.integers(1, 4))):
        sizes = draw(st.lists(gpu_sizes, min_size=1, max_size=4))
        gpus = tuple(
            Gpu(index=i, uuid=f"GPU-{n}-{i}", mem=size, healthy=draw(st.booleans()) or i > 0)
            for i, size in enumerate(sizes)
        )
        nodes.append(
            NodeGpus(
                node=f"node-{n}",
                mode=draw(st.sampled_from([NodeMode.SHARE, NodeMode.CGPU, NodeMode.CORE_MEM])),
                gpus=gpus,
                max_pods_per_gpu=draw(st.sampled_from([1, 2, 5, 20])),
            )
        )
    return nodes


@st.composite
def gpu_pods(draw, name: str) -> Pod:
    kind = draw(st.sampled_from(["memory", "compute", "split", "whole", "multi", "init"]))
    mem = st.integers(1, 30)
    if kind == "memory":
        return pod(name, mem=draw(mem))
    if kind == "compute":
        return pod(name, mem=draw(mem), core=5 * draw(st.integers(1, 20)))
    if kind == "split":
        ways = draw(st.integers(2, 4))
        return pod(
            name, mem=ways * draw(st.integers(1, 10)), labels={"aliyun.com/gpu-count": str(ways)}
        )
    if kind == "whole":
        return pod(name, count=draw(st.integers(1, 2)))
    core = draw(st.one_of(st.none(), st.integers(1, 10).map(lambda x: 5 * x)))
    containers = [
        container(f"c{i}", mem=draw(mem), core=core) for i in range(draw(st.integers(2, 3)))
    ]
    inits = [container("init", mem=draw(mem), core=core)] if kind == "init" else []
    return pod(name, containers=containers, init_containers=inits)


@st.composite
def streams(draw) -> list[tuple[str, Pod | str]]:
    """Arrivals ("add", pod) interleaved with departures ("remove", key)."""
    steps: list[tuple[str, Pod | str]] = []
    for i in range(draw(st.integers(1, 40))):
        steps.append(("add", draw(gpu_pods(f"p{i}"))))
        if i and draw(st.integers(0, 4)) == 0:
            steps.append(("remove", f"default/p{draw(st.integers(0, i))}"))
    return steps


def check_invariants(cluster: ClusterState) -> None:
    for name, node_state in cluster.nodes.items():
        inventory = node_state.inventory
        run_mem: dict[int, int] = defaultdict(int)
        run_core: dict[int, int] = defaultdict(int)
        init_mem: dict[int, int] = defaultdict(int)
        init_core: dict[int, int] = defaultdict(int)
        pods_on: dict[int, set[str]] = defaultdict(set)
        exclusive_on: dict[int, set[str]] = defaultdict(set)
        job_types = set()
        for key, allocation in node_state.pods.items():
            job_types.add(allocation.job_type)
            per_pod_init: dict[int, tuple[int, int]] = {}
            for c in allocation.containers:
                for s in c.gpus:
                    pods_on[s.index].add(key)
                    if c.exclusive:
                        exclusive_on[s.index].add(key)
                    if c.role is ContainerRole.INIT:
                        m, k = per_pod_init.get(s.index, (0, 0))
                        per_pod_init[s.index] = (max(m, s.mem), max(k, s.core))
                    else:
                        run_mem[(s.index)] += s.mem
                        run_core[(s.index)] += s.core
            for index, (m, k) in per_pod_init.items():
                init_mem[index] += m
                init_core[index] += k
        for gpu in inventory.gpus:
            i = gpu.index
            assert run_mem[i] <= gpu.mem, f"{name} GPU {i} memory over capacity"
            assert init_mem[i] <= gpu.mem, f"{name} GPU {i} init memory over capacity"
            assert run_core[i] <= gpu.core, f"{name} GPU {i} compute over 100%"
            assert len(pods_on[i]) <= inventory.max_pods_per_gpu, f"{name} GPU {i} too many pods"
            if exclusive_on[i]:
                assert pods_on[i] == exclusive_on[i] and len(pods_on[i]) == 1
        assert not {JobType.MEMORY, JobType.MEMORY_CORE} <= job_types, f"{name} mixes job types"


def check_allocation_matches_request(allocation: PodAllocation, p: Pod) -> None:
    request = parse_pod_request(p)
    assert request is not None
    for want, got in zip(request.containers, allocation.containers, strict=True):
        assert got.name == want.name
        assert len({s.index for s in got.gpus}) == want.gpus == len(got.gpus)
        if not want.exclusive:
            assert all(s.mem == want.mem and s.core == want.core for s in got.gpus)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=inventories(), steps=streams(), data=st.data())
def test_random_streams_keep_every_rule(nodes, steps, data):
    cluster = ClusterState()
    for inventory in nodes:
        cluster.set_node(inventory)
    live_pods: dict[str, Pod] = {}
    for action, item in steps:
        if action == "remove":
            assert isinstance(item, str)
            cluster.remove_pod(item)
            live_pods.pop(item, None)
            continue
        assert isinstance(item, Pod)
        try:
            request = parse_pod_request(item)
        except PodRefused as refused:
            assert refused.refusals and all(r.message for r in refused.refusals)
            continue
        assert request is not None
        policy = POLICIES[data.draw(st.sampled_from(sorted(POLICIES)))]()
        views = [cluster.nodes[n].view() for n in sorted(cluster.nodes)]
        # kube-scheduler's part: every node is scored, the best one wins
        results = {v.name: evaluate(v, request, policy) for v in views}
        fitting = {n: r for n, r in results.items() if isinstance(r, Placement)}
        if fitting:
            chosen = max(fitting, key=lambda n: fitting[n].score)
            placement = fitting[chosen]
            inventory = cluster.nodes[chosen].inventory
            for index in {i for gpus in placement.assignment.gpus for i in gpus}:
                assert inventory.gpu(index).healthy, "placed on an unhealthy GPU"
            allocation = to_allocation(request, placement.assignment, inventory, T0)
            check_allocation_matches_request(allocation, item)
            cluster.add_pod(item.key, allocation)
            live_pods[item.key] = item.model_copy(
                update={
                    "metadata": item.metadata.model_copy(
                        update={"annotations": annotation.encode(allocation)}
                    ),
                    "spec": item.spec.model_copy(update={"node_name": chosen}),
                }
            )
        else:
            assert set(results) == set(cluster.nodes)
            for refusal in results.values():
                assert isinstance(refusal, Refusal) and refusal.message and refusal.rule
        check_invariants(cluster)

    node_objects = [
        node(inv.node, ",".join(f"1x{g.mem}GiB" for g in inv.gpus), mode=inv.mode) for inv in nodes
    ]
    rebuilt, problems = ClusterState.rebuild(node_objects, live_pods.values())
    assert problems == []
    live = cluster.snapshot()
    again = rebuilt.snapshot()
    assert again.pods == live.pods
    assert again.gpus == live.gpus
