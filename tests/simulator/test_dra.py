"""DRA mode in the simulator (gpushare.simulator.dra): kube-scheduler's structured
allocator takes the first eligible GPUs in slice order (DRA-INTERFACES §6), on the node
kube-scheduler chooses with the DRA plugin among its filters and no GPU term in its
scoring; our extender may score the nodes (dra+score) and the driver may reorder its
slice (dra+order, dra+fullest)."""

import pytest

from gpushare.cli.main import main
from gpushare.dra.firstfit import SHARES_PER_GPU, DeviceLeft, devices_left, first_fit
from gpushare.placement.fit import evaluate, to_allocation
from gpushare.placement.policies import POLICIES
from gpushare.simulator.dra import DraMode, DraScheduler
from gpushare.simulator.kubescheduler import CHART, KubeSchedulerConfig
from gpushare.simulator.run import BOUND_AT, PolicyChoice, simulate
from gpushare.simulator.trace import Trace, TraceNode, TracePod, load
from gpushare.state import NodeState
from tests.simulator.traces import subsample


def device(index: int, left: int = 1000, cores: int | None = None, model: str = "T4",
           shares: int = SHARES_PER_GPU) -> DeviceLeft:  # fmt: skip
    return DeviceLeft(
        index=index,
        model=model,
        memory=left,
        cores=left if cores is None else cores,
        shares=shares,
        untouched=left == 1000 and shares == SHARES_PER_GPU,
    )


def pod(name: str = "p", milli: int = 250, gpus: int = 1, cpu: int = 1000,
        memory: int = 4096, spec: frozenset[str] | None = None) -> TracePod:  # fmt: skip
    return TracePod(name, cpu, memory, num_gpu=gpus if milli else 0, gpu_milli=milli, gpu_spec=spec)


def picked(devices, request_pod: TracePod, order=None):
    fit = first_fit(devices, request_pod.request(), order)
    return None if fit is None else fit.gpus[0]


def test_first_fit_takes_the_lowest_index_eligible_gpu_not_the_best_fitting_one():
    # GPU 0 is too full, GPU 1 is empty, GPU 2 has exactly the pod's 250 left: best fit
    # (and every policy of ours) would complete GPU 2; the allocator takes GPU 1.
    devices = [device(0, left=200), device(1), device(2, left=250)]
    assert picked(devices, pod(milli=250)) == (1,)
    assert picked(devices, pod(milli=200)) == (0,)  # exactly what is left fits


def test_a_gpu_without_the_cores_or_a_share_left_is_not_eligible():
    devices = [device(0, left=900, cores=100), device(1, shares=0, left=900), device(2, left=300)]
    assert picked(devices, pod(milli=250)) == (2,)
    assert picked([device(0, shares=1, left=900)], pod(milli=250)) == (0,)


def test_a_claim_pinned_to_a_model_skips_gpus_of_other_models():
    devices = [device(0, model="P100"), device(1, model="T4")]
    assert picked(devices, pod(spec=frozenset({"T4"}))) == (1,)
    assert picked(devices, pod(spec=frozenset({"V100"}))) is None


def test_count_n_takes_the_first_n_eligible_gpus_each_once():
    devices = [device(0), device(1, left=100), device(2), device(3)]
    fit = first_fit(devices, pod(milli=300, gpus=2).request())
    assert fit is not None and fit.gpus == ((0, 2),)
    assert fit.added == ((0, 300, 300), (2, 300, 300))
    # One GPU with room for both slices is still one device: count 2 needs two.
    assert picked([device(0), device(1, left=100)], pod(milli=300, gpus=2)) is None


def test_a_whole_gpu_request_takes_only_untouched_gpus():
    devices = [device(0, left=999), device(1), device(2, left=1000, shares=SHARES_PER_GPU - 1)]
    fit = first_fit(devices, pod(milli=1000).request())
    assert fit is not None and fit.gpus == ((1,),) and fit.added == ((1, 1000, 1000),)
    assert picked(devices, pod(milli=1000, gpus=2)) is None


def test_the_slice_order_decides_which_eligible_gpu_comes_first():
    devices = [device(0), device(1, left=400), device(2, left=300)]
    assert picked(devices, pod(milli=250), order=[2, 1, 0]) == (2,)
    assert picked(devices, pod(milli=350), order=[2, 1, 0]) == (1,)


def test_shares_left_count_the_claims_a_gpu_already_serves():
    state = NodeState(node("n", gpus=2).inventory())
    tiny = pod("tiny", milli=10)
    for i in range(SHARES_PER_GPU):
        place(state, tiny, gpu=0, key=f"tiny-{i}")
    left = devices_left(state)
    assert [d.shares for d in left] == [0, SHARES_PER_GPU]
    assert [d.memory for d in left] == [1000 - 10 * SHARES_PER_GPU, 1000]
    assert [d.untouched for d in left] == [False, True]
    assert picked(left, pod(milli=10)) == (1,)  # GPU 0 has memory left but no share


def node(name: str, gpus: int = 4, cpu: int = 64_000, memory: int = 256 * 1024) -> TraceNode:
    return TraceNode(name, cpu_milli=cpu, memory_mib=memory, gpus=gpus, model="T4")


def place(state: NodeState, running: TracePod, gpu: int, key: str = "running") -> None:
    """Binds a pod to one GPU (or, whole-GPU, the first ones) of the node."""
    request = running.request()
    order = dict.fromkeys([gpu, *range(len(state.inventory.gpus))])
    fit = first_fit(devices_left(state), request, order=list(order))
    assert fit is not None
    state.add(key, to_allocation(request, fit, state.inventory, BOUND_AT))


def dra_scheduler(nodes, mode, config=CHART, policy="binpack", seed=1):
    states = [NodeState(n.inventory()) for n in nodes]
    made = DraScheduler(nodes, states, range(len(nodes)), POLICIES[policy](), config, seed, mode)
    return made, states


def running(scheduler: DraScheduler, states, index: int, what: TracePod, gpu: int = 0) -> None:
    place(states[index], what, gpu, key=what.name)
    scheduler.placed(index, what)


def test_a_node_where_the_claim_cannot_be_allocated_is_filtered():
    nodes = [node("full", gpus=1), node("free", gpus=1)]
    for mode in DraMode:
        kube, states = dra_scheduler(nodes, mode)
        running(kube, states, 0, pod("big", milli=800))
        assert kube.choose(pod(milli=250).request(), pod(milli=250))[0] == 1, mode
        running(kube, states, 1, pod("big2", milli=800))
        assert kube.choose(pod(milli=250).request(), pod(milli=250)) is None, mode


def test_nodes_the_dra_filter_refuses_do_not_count_toward_the_sample():
    # Odd nodes have no GPU. The DRA plugin is one of kube-scheduler's filters, so a
    # search finds its 100 nodes among the even ones and the next starts past node 198.
    nodes = [node(f"n{i:03d}", gpus=0 if i % 2 else 4) for i in range(300)]
    config = KubeSchedulerConfig(percentage_of_nodes_to_score=10)
    kube, _ = dra_scheduler(nodes, DraMode.FIRST_FIT, config)
    first = kube._sample(pod(), pod().request())
    assert first == list(range(0, 200, 2))
    assert kube._sample(pod(), pod().request())[0] == 200


def busy_cluster(mode: DraMode) -> DraScheduler:
    """Node 0 runs a CPU- and memory-heavy pod, node 1 a 3-GPU pod: kube-scheduler's
    MostAllocated over CPU and memory prefers node 0, over GPU memory too (device-plugin
    mode) node 1, and so does binpack (fuller GPUs)."""
    kube, states = dra_scheduler([node("cpu-busy"), node("gpu-busy")], mode)
    running(kube, states, 0, pod("cpu-hog", milli=0, cpu=32_000, memory=128 * 1024))
    running(kube, states, 1, pod("gpu-hog", milli=1000, gpus=3, cpu=100))
    return kube


def test_without_an_extender_kube_schedulers_cpu_and_memory_scores_choose_the_node():
    assert busy_cluster(DraMode.FIRST_FIT).choose(pod().request(), pod())[0] == 0


@pytest.mark.parametrize("mode", [DraMode.SCORE, DraMode.ORDER, DraMode.FULLEST])
def test_with_our_extenders_scores_the_policys_node_wins(mode):
    assert busy_cluster(mode).choose(pod().request(), pod())[0] == 1


def test_dra_score_keeps_first_fit_and_dra_order_takes_the_policys_gpu():
    # GPU 0 is empty, GPU 1 half full: binpack places a quarter on GPU 1.
    half = pod("half", milli=500)
    chosen = {}
    for mode in (DraMode.SCORE, DraMode.ORDER):
        kube, states = dra_scheduler([node("n", gpus=2)], mode)
        running(kube, states, 0, half, gpu=1)
        policy_choice = evaluate(states[0].view(), pod().request(), POLICIES["binpack"]())
        assert policy_choice.assignment.gpus == ((1,),)
        chosen[mode] = kube.choose(pod().request(), pod())[1].assignment.gpus
    assert chosen == {DraMode.SCORE: ((0,),), DraMode.ORDER: ((1,),)}


def test_dra_fullest_republishes_the_slice_only_when_the_fullest_first_order_changes():
    kube, states = dra_scheduler([node("n", gpus=2)], DraMode.FULLEST)
    steps = []
    for name, milli in (("a", 250), ("b", 800), ("c", 150), ("d", 100)):
        node_index, placement = kube.choose(pod(name, milli).request(), pod(name, milli))
        states[node_index].add(
            name, to_allocation(pod(name, milli).request(), placement.assignment,
                                states[node_index].inventory, BOUND_AT)
        )  # fmt: skip
        kube.placed(node_index, pod(name, milli))
        steps.append((placement.assignment.gpus[0][0], kube.slice_writes))
    # a: GPU 0 (750 left), order still 0, 1; b: only GPU 1 fits (200 left), order 1, 0:
    # a write; c: the fullest, GPU 1 (50 left); d: GPU 1 too small, GPU 0 (650 left).
    assert steps == [(0, 0), (1, 1), (1, 1), (0, 1)]


def test_dra_order_counts_a_slice_write_per_gpu_pod():
    kube, states = dra_scheduler([node("n")], DraMode.ORDER)
    running(kube, states, 0, pod("a"))
    running(kube, states, 0, pod("cpu", milli=0))
    running(kube, states, 0, pod("b"), gpu=1)
    assert kube.slice_writes == 2


def choices(seed: int) -> list[int]:
    kube, states = dra_scheduler([node(f"n{i}", gpus=2) for i in range(6)], DraMode.FIRST_FIT,
                                 seed=seed)  # fmt: skip
    nodes = []
    for i in range(10):
        index, placement = kube.choose(pod(f"p{i}", 500).request(), pod(f"p{i}", 500))
        states[index].add(
            f"p{i}", to_allocation(pod().request(), placement.assignment,
                                   states[index].inventory, BOUND_AT)
        )  # fmt: skip
        kube.placed(index, pod(f"p{i}", 500))
        nodes.append(index)
    return nodes


def test_kube_schedulers_ties_are_random_but_the_same_under_a_seed():
    assert choices(7) == choices(7)
    assert len({tuple(choices(seed)) for seed in range(7, 12)}) > 1


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Every 25th node and pod of openb: 49 nodes of every kind, 327 pods."""
    return subsample(tmp_path_factory.mktemp("trace"), every=25)


def test_a_run_in_dra_mode_passes_the_ledger_and_counts_slice_writes(small):
    trace: Trace = load(*small)
    runs = {
        mode: simulate(trace, PolicyChoice.parse("fgd-lookahead"), seed=42, dra=mode)
        for mode in DraMode
    }
    gpu_pods_placed = runs[DraMode.ORDER].pods - sum(runs[DraMode.ORDER].failed.values())
    assert runs[DraMode.FIRST_FIT].slice_writes == runs[DraMode.SCORE].slice_writes == 0
    assert 0 < runs[DraMode.FULLEST].slice_writes < runs[DraMode.ORDER].slice_writes
    assert runs[DraMode.ORDER].slice_writes <= gpu_pods_placed
    again = simulate(trace, PolicyChoice.parse("fgd-lookahead"), seed=42, dra=DraMode.FIRST_FIT)
    assert again.bins == runs[DraMode.FIRST_FIT].bins


def test_the_simulate_flag_says_what_it_models(small, capsys):
    nodes, pods = small
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policies", "binpack"]
    assert main([*argv, "--seeds", "42", "--workers", "1", "--no-plot", "--dra", "first-fit"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # lines wrapped at 100 columns
    assert "NodeResourcesFit MostAllocated (cpu 1, memory 1), no extender" in out
    assert "DRA mode, dra: nodes by kube-scheduler's plugins alone" in out
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--dra", "best"])
    assert exit_.value.code == 2
    assert "'first-fit', 'score', 'order', 'fullest'" in capsys.readouterr().err
