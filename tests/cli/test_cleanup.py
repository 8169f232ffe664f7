"""`gpushare uninstall-cleanup` against the fake API server, over real HTTP with the
official client, as the chart's post-delete hook runs it."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushare.cli.main import main
from gpushare.cluster.memory import MemoryCluster
from gpushare.dra.slices import NodeRef, node_slice
from gpushare.inventory import NODE_GPUS_ANNOTATION, Gpu
from tests.builders import node
from tests.kubecluster.apiserver import ApiServer

NS = "gpushare-system"
KEPT = {
    "gpushare.io/gpus-note": "a key that only begins like ours",
    "node.alpha.kubernetes.io/ttl": "0",
}


def lease(name: str, namespace: str = NS) -> dict:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"holderIdentity": "gs-gpushare-scheduler-0"},
    }


@pytest.fixture
def memory() -> MemoryCluster:
    """Two GPU nodes the device plugin annotated (one with others' annotations beside
    ours) and a node without the annotation."""
    cluster = MemoryCluster()
    for name in ("gpu-a", "gpu-b", "cpu-c"):
        cluster.add_node(node(name))
    cluster.patch_node_annotations("gpu-a", KEPT)
    cluster.patch_node_annotations("cpu-c", {NODE_GPUS_ANNOTATION: None})
    return cluster


@pytest.fixture
def api(memory: MemoryCluster) -> Iterator[ApiServer]:
    server = ApiServer(memory)
    yield server
    server.close()


@pytest.fixture
def kubeconfig(api: ApiServer, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "kubeconfig")


def cleanup(kubeconfig: Path, *args: str) -> int:
    return main(["uninstall-cleanup", "--kubeconfig", str(kubeconfig), *args])


def annotations(memory: MemoryCluster, name: str) -> dict[str, str]:
    return dict(memory.get_node(name).metadata.annotations)


def test_removes_our_annotation_from_each_node_and_nothing_else(memory, api, kubeconfig, capsys):
    before = {name: annotations(memory, name) for name in ("gpu-a", "gpu-b", "cpu-c")}
    assert NODE_GPUS_ANNOTATION in before["gpu-a"] and NODE_GPUS_ANNOTATION in before["gpu-b"]

    assert cleanup(kubeconfig) == 0

    for name, had in before.items():
        had.pop(NODE_GPUS_ANNOTATION, None)
        assert annotations(memory, name) == had, name
    assert KEPT.items() <= annotations(memory, "gpu-a").items()
    # One merge patch per annotated node, deleting our key alone (null); none for cpu-c.
    patches = api.seen("PATCH", "/api/v1/nodes/")
    assert sorted(p.path for p in patches) == ["/api/v1/nodes/gpu-a", "/api/v1/nodes/gpu-b"]
    for patch in patches:
        assert patch.content_type == "application/merge-patch+json"
        assert patch.body == {"metadata": {"annotations": {NODE_GPUS_ANNOTATION: None}}}
    out = capsys.readouterr().out.splitlines()
    assert f"removed {NODE_GPUS_ANNOTATION} from node gpu-a" in out
    assert f"removed {NODE_GPUS_ANNOTATION} from node gpu-b" in out
    assert out[-1] == "gpushare uninstall-cleanup: 2 removed, 0 already gone, 0 failed"


def test_deletes_the_named_leases_and_a_missing_one_is_no_failure(api, kubeconfig, capsys):
    scheduler = api.store(lease("gpushare-scheduler"))
    other = api.store(lease("kube-scheduler", namespace="kube-system"))

    code = cleanup(
        kubeconfig, "--lease", f"{NS}/gpushare-scheduler", "--lease", f"{NS}/gpushare-extender"
    )

    assert code == 0
    assert scheduler not in api.stored and other in api.stored
    out = capsys.readouterr().out
    assert f"removed lease {NS}/gpushare-scheduler" in out
    assert f"already gone: lease {NS}/gpushare-extender" in out
    assert out.endswith("3 removed, 1 already gone, 0 failed\n")  # 2 nodes, 1 Lease


def test_deletes_the_named_secret(api, kubeconfig):
    secret = api.store(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "gs-gpushare-webhook-tls", "namespace": NS},
        }
    )
    assert cleanup(kubeconfig, "--secret", f"{NS}/gs-gpushare-webhook-tls") == 0
    assert secret not in api.stored


def test_a_second_run_finds_nothing_left_and_succeeds(api, kubeconfig, capsys):
    api.store(lease("gpushare-scheduler"))
    assert cleanup(kubeconfig, "--lease", f"{NS}/gpushare-scheduler") == 0
    patched = len(api.seen("PATCH"))
    capsys.readouterr()

    assert cleanup(kubeconfig, "--lease", f"{NS}/gpushare-scheduler") == 0

    assert len(api.seen("PATCH")) == patched
    assert capsys.readouterr().out.endswith("0 removed, 1 already gone, 0 failed\n")


def test_a_refused_delete_fails_naming_verb_and_resource_and_the_rest_is_done(
    memory, api, kubeconfig, capsys
):
    path = api.store(lease("gpushare-scheduler"))
    api.forbidden["DELETE", path] = (
        'leases.coordination.k8s.io "gpushare-scheduler" is forbidden: User '
        '"system:serviceaccount:gpushare-system:gs-gpushare-uninstall-cleanup" cannot '
        'delete resource "leases" in API group "coordination.k8s.io" in the namespace '
        '"gpushare-system"'
    )

    assert cleanup(kubeconfig, "--lease", f"{NS}/gpushare-scheduler") == 1

    assert path in api.stored
    assert all(NODE_GPUS_ANNOTATION not in annotations(memory, n) for n in ("gpu-a", "gpu-b"))
    captured = capsys.readouterr()
    [failure] = captured.err.splitlines()
    assert failure.startswith(
        f"gpushare uninstall-cleanup: failed: delete lease {NS}/gpushare-scheduler: "
    )
    assert 'cannot delete resource "leases"' in failure and failure.endswith("(HTTP 403)")
    assert captured.out.endswith("2 removed, 0 already gone, 1 failed\n")


def test_a_refused_node_patch_says_what_it_was_for(api, kubeconfig, capsys):
    api.forbidden["PATCH", "/api/v1/nodes/gpu-b"] = (
        'nodes "gpu-b" is forbidden: User "system:serviceaccount:x:y" cannot patch '
        'resource "nodes" in API group "" at the cluster scope'
    )
    assert cleanup(kubeconfig) == 1
    [failure] = capsys.readouterr().err.splitlines()
    assert f"failed: remove {NODE_GPUS_ANNOTATION}: node gpu-b: " in failure
    assert 'cannot patch resource "nodes"' in failure


def test_nodes_that_cannot_be_listed_fail_the_run(api, kubeconfig, capsys):
    api.forbidden["GET", "/api/v1/nodes"] = 'nodes is forbidden: cannot list resource "nodes"'
    assert cleanup(kubeconfig) == 1
    assert "failed: list nodes: nodes is forbidden" in capsys.readouterr().err


def test_without_a_cluster_it_says_so(tmp_path, capsys):
    assert cleanup(tmp_path / "missing") == 1
    err = capsys.readouterr().err
    assert f"cannot find the Kubernetes API: the kubeconfig {tmp_path / 'missing'}: does not" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["gpushare-scheduler", "/name", "ns/", "ns/a/b"])
def test_a_lease_must_be_namespace_slash_name(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["uninstall-cleanup", "--lease", value])
    assert exit_.value.code == 2
    assert "expected NAMESPACE/NAME" in capsys.readouterr().err


def test_deletes_every_resource_slice_of_the_driver_and_only_those(memory, kubeconfig, capsys):
    gpus = (Gpu(0, "GPU-a", 16),)
    for name in ("gpu-a", "gpu-b"):
        memory.create_resource_slice(node_slice(NodeRef(name, f"uid-{name}"), gpus, None, False))
    theirs = node_slice(NodeRef("gpu-a", "uid-gpu-a"), gpus, None, False)
    theirs = theirs.model_copy(
        update={"spec": theirs.spec.model_copy(update={"driver": "gpu.nvidia.com"})}
    )
    memory.create_resource_slice(theirs)

    assert cleanup(kubeconfig, "--resource-slice-driver", "gpu.gpushare.io") == 0

    assert memory.list_resource_slices("gpu.gpushare.io") == []
    assert [s.spec.driver for s in memory.list_resource_slices()] == ["gpu.nvidia.com"]
    assert capsys.readouterr().out.count("removed ResourceSlice gpu-") == 2
