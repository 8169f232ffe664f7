"""`kubectl inspect cgpu` against fixed cluster states on the in-memory cluster."""

import subprocess
import sys

import pytest

from gpushare import annotation
from gpushare.cli import inspect
from gpushare.cluster.memory import MemoryCluster, gpu_node
from gpushare.cluster.port import NotFound
from gpushare.extender.policychoice import PolicyChoice
from gpushare.inventory import parse_layout
from gpushare.objects import Pod
from gpushare.placement.fit import Placement, evaluate, to_allocation
from gpushare.placement.policies import POLICIES
from gpushare.request import parse_pod_request
from gpushare.state import ClusterState
from tests.builders import T0, container, pod
from tests.kubecluster.apiserver import ApiServer


def place(cluster: MemoryCluster, new: Pod, node: str) -> None:
    """Bind the pod to `node` as the extender would: its placement, its annotations."""
    created = cluster.create_pod(new)
    state, _ = ClusterState.rebuild(cluster.list_nodes().items, cluster.list_pods().items)
    request = parse_pod_request(created)
    assert request is not None
    view = state.nodes[node].view()
    placement = evaluate(
        view,
        request,
        POLICIES[
            PolicyChoice(POLICIES, "binpack").of_node(cluster.get_node(node).metadata.labels)
        ](),
    )
    assert isinstance(placement, Placement), placement
    allocation = to_allocation(request, placement.assignment, state.nodes[node].inventory, T0)
    meta = created.metadata
    cluster.bind_pod(meta.namespace, meta.name, node, annotations=annotation.encode(allocation))


@pytest.fixture
def cluster() -> MemoryCluster:
    """Two GPU nodes of different shapes, a node without GPUs, five pods."""
    cluster = MemoryCluster()
    cluster.add_node(
        gpu_node("gpu-a", parse_layout("2x16GiB", "gpu-a"), mode="core_mem", ip="10.0.0.11")
    )
    cluster.add_node(
        gpu_node("gpu-b", parse_layout("1x24GiB", "gpu-b"), mode="cgpu", ip="10.0.0.12")
    )
    cluster.add_node(gpu_node("cpu-c", (), mode=None, ip="10.0.0.13"))
    place(cluster, pod("train-1", mem=6, core=30), "gpu-a")
    place(cluster, pod("train-2", mem=12, core=50), "gpu-a")  # does not fit beside train-1
    place(cluster, pod("serve", mem=4, namespace="ml"), "gpu-b")
    place(
        cluster,
        pod(
            "sidecars",
            containers=[container("server", 3), container("metrics", 2)],
            namespace="ml",
        ),
        "gpu-b",
    )
    done = pod("finished", mem=10)
    place(cluster, done, "gpu-b")
    cluster.set_pod_phase("default", "finished", "Succeeded")  # no longer holds its GPU
    return cluster


SUMMARY = """\
NAME   IPADDRESS  GPU0(Allocated/Total)  GPU1(Allocated/Total)  GPU Memory(GiB)
gpu-a  10.0.0.11  6/16                   12/16                  18/32
gpu-b  10.0.0.12  9/24                                          9/24
-------------------------------------------------------------------------------
Allocated/Total GPU Memory In Cluster:
27/56 (48%)"""


def test_summary_has_a_column_per_gpu_and_the_cluster_total(cluster):
    assert inspect.inspect(cluster, None, False) == SUMMARY


DETAILS = """
NAME:       gpu-a
IPADDRESS:  10.0.0.11

NAME     NAMESPACE  GPU0(Allocated)  GPU1(Allocated)
train-1  default    6                0
train-2  default    0                12
Allocated :  18 (56%)
Total :      32
----------------------------------------------------

NAME:       gpu-b
IPADDRESS:  10.0.0.12

NAME      NAMESPACE  GPU0(Allocated)
serve     ml         4
sidecars  ml         5
Allocated :  9 (37%)
Total :      24
------------------------------------


Allocated/Total GPU Memory In Cluster:  27/56 (48%)"""


def test_details_list_every_pod_with_its_memory_on_each_gpu(cluster):
    assert inspect.inspect(cluster, None, True) == DETAILS


def test_one_node_narrows_the_summary(cluster):
    assert inspect.inspect(cluster, "gpu-b", False) == (
        "NAME   IPADDRESS  GPU0(Allocated/Total)  GPU Memory(GiB)\n"
        "gpu-b  10.0.0.12  9/24                   9/24\n"
        "--------------------------------------------------------\n"
        "Allocated/Total GPU Memory In Cluster:\n"
        "9/24 (37%)"
    )


def test_an_unknown_node_is_not_found(cluster):
    with pytest.raises(NotFound, match="nope"):
        inspect.inspect(cluster, "nope", False)


def test_pods_placed_by_acks_gpushare_are_counted():
    """A pod carrying only ACK's keys (as ACK's scheduler leaves it) shows up too."""
    cluster = MemoryCluster()
    cluster.add_node(
        gpu_node("ack-1", parse_layout("2x15GiB", "ack-1"), mode="share", ip="1.2.3.4")
    )
    legacy = pod(
        "legacy",
        mem=3,
        node="ack-1",
        annotations={
            "ALIYUN_COM_GPU_MEM_IDX": "1",
            "ALIYUN_COM_GPU_MEM_POD": "3",
            "ALIYUN_COM_GPU_MEM_DEV": "15",
            "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1700000000000000000",
            "ALIYUN_COM_GPU_MEM_ASSIGNED": "true",
        },
    )
    cluster.create_pod(legacy)
    v2 = pod(
        "v2",
        mem=5,
        node="ack-1",
        annotations={
            "scheduler.framework.gpushare.allocation": '{"0":{"0":5}}',
            "scheduler.framework.gpushare.assigned": "true",
        },
    )
    cluster.create_pod(v2)
    out = inspect.inspect(cluster, None, True)
    assert "legacy  default    0                3" in out
    assert "v2      default    5                0" in out
    assert out.endswith("Allocated/Total GPU Memory In Cluster:  8/30 (26%)")


def test_an_unreadable_annotation_is_skipped_with_a_warning(caplog):
    cluster = MemoryCluster()
    cluster.add_node(gpu_node("n1", parse_layout("1x8GiB", "n1"), ip="1.1.1.1"))
    cluster.create_pod(
        pod("broken", mem=1, node="n1", annotations={"gpushare.io/allocation": "{not json"})
    )
    out = inspect.inspect(cluster, None, False)
    assert "n1    1.1.1.1    0/8" in out
    assert "default/broken" in caplog.text and "not a JSON object" in caplog.text


def test_an_empty_cluster_prints_zero_totals():
    assert inspect.inspect(MemoryCluster(), None, False).endswith(
        "Allocated/Total GPU Memory In Cluster:\n0/0 (0%)"
    )


def test_help_explains_the_arguments():
    result = subprocess.run(
        [sys.executable, "-m", "gpushare.cli.inspect", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    for flag in ("NODE", "--details", "--kubeconfig"):
        assert flag in result.stdout


class _FakeKubeCluster:
    """Stands in for kubecluster.KubeCluster (the Kubernetes adapter, another part)."""

    opened: list[str | None] = []
    cluster: MemoryCluster

    @classmethod
    def from_config(cls, kubeconfig: str | None) -> MemoryCluster:
        cls.opened.append(kubeconfig)
        return cls.cluster


@pytest.fixture
def kube(monkeypatch, cluster):
    _FakeKubeCluster.opened = []
    _FakeKubeCluster.cluster = cluster
    module = type(sys)("gpushare.kubecluster")
    module.KubeCluster = _FakeKubeCluster
    monkeypatch.setitem(sys.modules, "gpushare.kubecluster", module)
    return _FakeKubeCluster


def test_main_reads_the_cluster_of_the_given_kubeconfig(kube, capsys):
    assert inspect.main(["--kubeconfig", "/tmp/kc", "-d", "gpu-a"]) == 0
    assert kube.opened == ["/tmp/kc"]
    out = capsys.readouterr().out
    assert "train-1  default" in out and "gpu-b" not in out


def test_main_defaults_to_in_cluster_or_kubeconfig_env(kube, capsys):
    assert inspect.main([]) == 0
    assert kube.opened == [None]
    assert capsys.readouterr().out.rstrip("\n") == SUMMARY


def test_main_names_an_unknown_node_and_fails(kube, capsys):
    assert inspect.main(["nope"]) == 1
    assert 'node "nope" not found' in capsys.readouterr().err


@pytest.mark.parametrize("where", ["KUBECONFIG", "HOME"])
def test_main_finds_the_cluster_as_kubectl_does(cluster, where, monkeypatch, tmp_path, capsys):
    """In a shell: $KUBECONFIG, else ~/.kube/config, not the in-cluster service account."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    api = ApiServer(cluster)
    try:
        if where == "KUBECONFIG":
            monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kc")))
        else:
            monkeypatch.delenv("KUBECONFIG", raising=False)
            api.write_kubeconfig(tmp_path / "home" / ".kube" / "config")
        assert inspect.main([]) == 0, capsys.readouterr().err
    finally:
        api.close()
    assert capsys.readouterr().out.rstrip("\n") == SUMMARY


def test_a_pod_being_deleted_still_counts_until_it_is_gone(cluster):
    cluster.begin_pod_deletion("default", "train-1")
    reports, _ = inspect.collect(cluster, "gpu-a")
    assert reports[0].allocated == 18
    cluster.delete_pod("default", "train-1")
    reports, _ = inspect.collect(cluster, "gpu-a")
    assert reports[0].allocated == 12
