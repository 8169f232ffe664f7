"""bench/scheduler_throughput_bench.py without Kubernetes binaries: the configuration it
starts kube-scheduler with, and the packing it reads off the bound pods."""

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare import annotation
from gpushare.allocation import ContainerAllocation, GpuSlice, PodAllocation
from gpushare.request import ContainerRole
from tests.builders import T0, pod
from tests.chart.rendering import render, scheduler_config
from tests.e2e.local import Binaries

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scheduler_throughput_bench.py"


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("scheduler_throughput_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = _load()


def given_to_kube_scheduler(tmp_path: Path, scoring: str) -> dict[str, Any]:
    """The configuration the bench's cluster hands up.sh (SCHED_CONFIG) for `scoring`."""
    bins = Binaries(tmp_path / "bin", "v1.33.3")
    cluster = bench.bench_cluster(tmp_path / scoring, bins, (), scoring)
    calls: dict[str, dict[str, str]] = {}

    def script(name: str, *args: str, **env: str) -> str:
        calls[name] = env
        return ""

    cluster.script = script
    cluster.start_cluster()
    config: dict[str, Any] = yaml.safe_load(Path(calls["up.sh"]["SCHED_CONFIG"]).read_text())
    return config


def fit_args(config: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each profile's NodeResourcesFit pluginConfig entries, by scheduler name."""
    return {
        profile["schedulerName"]: [
            plugin for plugin in profile.get("pluginConfig", ())
            if plugin["name"] == "NodeResourcesFit"
        ]
        for profile in config["profiles"]
    }  # fmt: skip


def test_chart_scoring_gives_kube_scheduler_the_charts_node_resources_fit(tmp_path: Path) -> None:
    chart = fit_args(scheduler_config(render()))
    assert chart and all(len(entries) == 1 for entries in chart.values()), chart
    assert fit_args(given_to_kube_scheduler(tmp_path, "chart")) == chart


def test_least_allocated_scoring_is_the_same_configuration_without_its_plugin_config(
    tmp_path: Path,
) -> None:
    chart = given_to_kube_scheduler(tmp_path, "chart")
    spread = given_to_kube_scheduler(tmp_path, "least-allocated")
    assert all("pluginConfig" not in profile for profile in spread["profiles"]), spread
    for profile in chart["profiles"]:
        del profile["pluginConfig"]
    assert spread == chart


def test_an_unknown_scoring_is_refused() -> None:
    with pytest.raises(ValueError, match="least_allocated"):
        bench.scheduler_config("least_allocated")


def bound(name: str, node: str, *slices: tuple[int, int]) -> dict[str, Any]:
    """A pod bound to `node`, its container holding (GPU index, GiB) of 16 GiB GPUs, its
    allocation annotated as the extender's bind writes it."""
    gpus = tuple(GpuSlice(index=index, mem=gib, gpu_mem=16) for index, gib in slices)
    main = ContainerAllocation(name="main", role=ContainerRole.APP, index=0, gpus=gpus)
    allocation = PodAllocation(node=node, bound_at=T0, containers=(main,))
    mem = sum(gib for _, gib in slices)
    manifest: dict[str, Any] = pod(
        name, mem=mem, node=node, annotations=annotation.encode(allocation)
    ).to_manifest()
    return manifest


def test_packing_counts_each_gpu_of_each_node_once_against_the_fewest_holding_as_much() -> None:
    pods = [
        bound("a", "n1", (0, 4)),
        bound("b", "n1", (0, 3)),  # the same GPU as a
        bound("c", "n1", (1, 2)),
        bound("d", "n2", (1, 8)),  # GPU 1 again, of another node
        bound("e", "n3", (2, 5), (3, 5)),  # two GPUs
    ]
    # 27 GiB: at least two 16 GiB GPUs, one node of 4 x 16 GiB.
    result = bench.packing(pods, (16, 16, 16, 16), 1000)
    assert result == bench.Packing(gpus=5, nodes=3, fewest_gpus=2, fewest_nodes=1)
    assert result.line() == "packing: 5 GPUs on 3 nodes (minimum 2 GPUs, 1 nodes)"


def test_a_bound_pod_without_an_allocation_is_not_left_out_of_the_packing() -> None:
    unrecorded = pod("x", mem=4, node="n1").to_manifest()
    with pytest.raises(ValueError, match="default/x is bound but has no allocation"):
        bench.packing([bound("a", "n1", (0, 4)), unrecorded], (16,), 10)


def test_the_fewest_gpus_take_the_largest_first_while_the_nodes_have_them() -> None:
    assert bench.fewest_gpus(30, (8, 24), nodes=2) == 2  # 24 + 24
    assert bench.fewest_gpus(60, (8, 24), nodes=2) == 4  # 24 + 24, then 8 + 8
    assert bench.fewest_gpus(0, (8, 24), nodes=2) == 0
