"""The clusters the end-to-end scenarios run on, each made once per session.

`deployed`: a kind cluster with gpushare installed from the chart (mock GPUs).
GPUSHARE_E2E=0 skips it; GPUSHARE_E2E_CLUSTER names the kind cluster (an existing one
is reused and kept); GPUSHARE_E2E_KEEP=1 keeps a cluster the suite created.
GPUSHARE_E2E_KUBECONFIG instead names any cluster where the chart is already
installed (with nodes labelled ack.node.gpu.schedule=cgpu and core_mem): the same
scenarios run there, nothing is created or deleted but their pods.

`local`: the real single-node cluster on this machine from upstream binaries
(GPUSHARE_E2E_K8S_BIN), with gpushare's parts as host processes (tests/e2e/local.py).
GPUSHARE_E2E_KEEP=1 leaves it running. When its cluster goes down, each real-cluster
tier records for the checkout's commit which version it ran on and how many tests
passed and failed (tests/e2e/results.py): the release notes name what it recorded.

On any failure the cluster's state and logs are written under the pytest base temp
directory, and the path is printed.
"""

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e import artifacts as released
from tests.e2e import bridge, localdra, results
from tests.e2e import local as local_tier
from tests.e2e.chart_scenarios import Installed
from tests.e2e.helm import HelmRelease
from tests.e2e.kind import Kind, missing_prerequisites
from tests.e2e.kube import ROOT, KubectlTarget, run, wait_for
from tests.e2e.workloads import IMAGE, WORKLOAD_LABEL

RELEASE = "gs"
SYSTEM_NAMESPACE = "gpushare-system"
MOCK_GPUS = "4x16GiB"
MODES = ("cgpu", "core_mem")

_failures: list[str] = []
_local_failures: list[str] = []
_local_passed: list[str] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and "e2e" in item.keywords:
        _failures.append(item.nodeid)
    if report.failed and "realcluster" in item.keywords:
        _local_failures.append(item.nodeid)
    if report.when == "call" and report.passed and "realcluster" in item.keywords:
        _local_passed.append(item.nodeid)


@dataclass(frozen=True)
class Deployed:
    kind: KubectlTarget
    """The cluster (a kind one, or any cluster GPUSHARE_E2E_KUBECONFIG names)."""
    workers: dict[str, str]
    """Worker node name -> the ack.node.gpu.schedule mode it was given."""
    installed: Installed | None = None
    """The release this suite installed (None on a cluster it did not install)."""


@pytest.fixture(scope="session")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    external = os.environ.get("GPUSHARE_E2E_KUBECONFIG")
    if external:
        yield already_installed(KubectlTarget(Path(external)))
        return
    reason = missing_prerequisites()
    if reason:
        pytest.skip(reason)
    kind = Kind(
        kubeconfig=tmp_path_factory.mktemp("kind") / "kubeconfig",
        name=os.environ.get("GPUSHARE_E2E_CLUSTER", "gpushare-e2e"),
    )
    reused = kind.exists()
    try:
        if reused:
            kind.export_kubeconfig()
        else:
            kind.create()
        yield install(kind)
    except BaseException:
        _failures.append("cluster setup")
        raise
    finally:
        if _failures:
            logs = kind.dump(
                tmp_path_factory.getbasetemp() / "e2e-logs",
                {SYSTEM_NAMESPACE: "app.kubernetes.io/part-of=gpushare", "default": WORKLOAD_LABEL},
            )
            print(f"\ne2e failures {_failures}: cluster state and logs in {logs}")
        if not reused and os.environ.get("GPUSHARE_E2E_KEEP") != "1":
            kind.delete()


def already_installed(cluster: KubectlTarget) -> Deployed:
    """Any cluster running gpushare: its GPU-sharing nodes, by the mode they are in."""
    nodes = cluster.get("nodes", "-l", "ack.node.gpu.schedule")["items"]
    workers = {
        n["metadata"]["name"]: n["metadata"]["labels"]["ack.node.gpu.schedule"] for n in nodes
    }
    assert set(workers.values()) >= set(MODES), f"want nodes in modes {MODES}, found {workers}"
    return Deployed(cluster, workers)


def install(kind: Kind) -> Deployed:
    """What an operator does: build and load the image, label nodes, helm install."""
    run(["docker", "build", "-t", IMAGE, str(ROOT)], timeout=1800)
    kind.load_image(IMAGE)
    nodes = kind.get("nodes", "-l", "!node-role.kubernetes.io/control-plane")["items"]
    workers = sorted(n["metadata"]["name"] for n in nodes)
    assert len(workers) >= len(MODES), f"kind-config.yaml should give two workers: {workers}"
    modes = dict(zip(workers, MODES, strict=False))
    for node, mode in modes.items():
        kind.kubectl("label", "node", node, f"ack.node.gpu.schedule={mode}", "--overwrite")
    repository, tag = IMAGE.rsplit(":", 1)
    values = {
        "gpu": {"backend": "mock", "mockGpus": MOCK_GPUS},
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
    }
    release = HelmRelease(kind.kubeconfig, RELEASE, SYSTEM_NAMESPACE, timeout_s=600)
    installed_at = time.monotonic()
    release.install_or_upgrade(values)
    for node in modes:
        wait_for(
            f"node {node} to advertise aliyun.com/gpu-mem",
            lambda node=node: (
                kind.get("node", node)["status"].get("allocatable", {}).get("aliyun.com/gpu-mem")
            ),
            timeout=300,
        )
    installed = Installed(
        target=kind,
        release=release,
        values=values,
        nodes=sorted(modes),
        image=IMAGE,
        pull_policy="Never",
        kill_containers=kind.kill_containers,
        installed_at=installed_at,
    )
    return Deployed(kind, modes, installed)


def venv_bin() -> Path:
    """Where the project's console scripts are, so kubectl finds the inspect plugin."""
    return Path(sys.executable).parent


def _version_id(source: Path | None) -> str:
    if source is None:
        return "no-binaries"
    version = source / "VERSION"
    return version.read_text().split()[0] if version.is_file() else source.name


@pytest.fixture(scope="session", params=local_tier.sources() or [None], ids=_version_id)
def local(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[local_tier.LocalCluster]:
    """One cluster per Kubernetes version; the tests run once on each."""
    source: Path | None = request.param
    reason = local_tier.missing_prerequisites(source)
    if reason:
        pytest.skip(reason)
    assert source is not None
    root = Path(os.environ.get("GPUSHARE_E2E_STATE_ROOT", "/tmp"))
    bins = local_tier.binaries(source, root)
    state = root / f"gpushare-e2e-{bins.version}"
    cluster = local_tier.LocalCluster(kubeconfig=state / "kubeconfig", state=state, bins=bins)
    yield from _up_for_the_tests(cluster, "real-cluster", tmp_path_factory)


def _up_for_the_tests(
    cluster: local_tier.LocalCluster, tier: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[local_tier.LocalCluster]:
    """Brings the cluster up for its tests; afterwards dumps its state if one of them
    failed, then takes it down (unless GPUSHARE_E2E_KEEP=1)."""
    version = cluster.version
    _local_failures.clear()
    _local_passed.clear()
    started = time.monotonic()
    try:
        cluster.up()
        print(
            f"\n{tier} {version}: "
            + ", ".join(f"{what} {seconds:.1f}s" for what, seconds in cluster.timings.items())
        )
        yield cluster
    except BaseException:
        _local_failures.append(f"{tier} cluster setup")
        raise
    finally:
        if _local_failures:
            logs = cluster.dump(tmp_path_factory.getbasetemp() / f"{tier}-{version}")
            print(f"\n{tier} failures {_local_failures}: state and logs in {logs}")
        if os.environ.get("GPUSHARE_E2E_KEEP") == "1":
            print(f"\nGPUSHARE_E2E_KEEP=1: cluster left running; KUBECONFIG={cluster.kubeconfig}")
        else:
            cluster.down()
        print(f"\n{tier} tier on {version}: {time.monotonic() - started:.0f}s")
        print(results.record_run(tier, version, len(_local_passed), len(_local_failures)))


@pytest.fixture
def clean_workloads(local: local_tier.LocalCluster) -> Iterator[None]:
    """Afterwards, no workload pod or Job is left (forced: their slices free at once)."""
    yield
    local.kubectl(
        "delete", "jobs,pods", "-l", WORKLOAD_LABEL, "--grace-period=0", "--force",
        "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150,
    )  # fmt: skip


@pytest.fixture(scope="session")
def release_artifacts() -> released.Artifacts:
    """scripts/release with the image, once per session (about a minute, nearly all of
    it the image): the chart tier installs these, not the source tree."""
    reason = released.missing_prerequisites()
    if reason:
        pytest.skip(reason)
    root = Path(os.environ.get("GPUSHARE_E2E_STATE_ROOT", "/tmp"))
    artifacts = released.make(root / "gpushare-e2e-release")
    print(f"\nscripts/release (with the image): {artifacts.took_s:.0f}s")
    return artifacts


@pytest.fixture(scope="module", params=local_tier.sources() or [None], ids=_version_id)
def chart_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[bridge.ChartCluster]:
    """The local cluster in bridge mode with the chart installed by Helm, one per
    Kubernetes version. It takes turns with `local` (one cluster per machine)."""
    source: Path | None = request.param
    reason = local_tier.missing_prerequisites(source)
    if reason:
        pytest.skip(reason)
    assert source is not None
    artifacts = request.getfixturevalue("release_artifacts")
    root = Path(os.environ.get("GPUSHARE_E2E_STATE_ROOT", "/tmp"))
    bins = local_tier.binaries(source, root)
    state = root / f"gpushare-chart-{bins.version}"
    cluster = bridge.ChartCluster(
        kubeconfig=state / "kubeconfig", state=state, bins=bins, artifacts=artifacts
    )
    yield from _up_for_the_tests(cluster, "chart", tmp_path_factory)


@pytest.fixture(scope="module", params=local_tier.sources() or [None], ids=_version_id)
def dra_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[localdra.LocalDraCluster]:
    """The local cluster with gpushare in DRA mode (tests/e2e/localdra.py), one per
    Kubernetes version from 1.34 on. It takes turns with `local` and `chart_cluster`."""
    source: Path | None = request.param
    reason = local_tier.missing_prerequisites(source)
    if reason:
        pytest.skip(reason)
    assert source is not None
    root = Path(os.environ.get("GPUSHARE_E2E_STATE_ROOT", "/tmp"))
    bins = local_tier.binaries(source, root)
    reason = localdra.unsupported(bins)
    if reason:
        pytest.skip(reason)
    state = root / f"gpushare-dra-{bins.version}"
    cluster = localdra.LocalDraCluster(kubeconfig=state / "kubeconfig", state=state, bins=bins)
    yield from _up_for_the_tests(cluster, "dra", tmp_path_factory)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each Kubernetes version's clusters come up once: all tests on the host-process
    cluster of a version, then all on its chart cluster, then all on its DRA cluster,
    then the next version (the kinds of cluster take turns on this machine's fixed
    ports)."""

    def turn(item: pytest.Item) -> tuple[str, int] | None:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        for kind, fixture in enumerate(("local", "chart_cluster", "dra_cluster")):
            if fixture in params:
                return (_version_id(params[fixture]), kind)
        return None

    slots = [n for n, item in enumerate(items) if turn(item) is not None]
    ordered = sorted((items[n] for n in slots), key=lambda item: turn(item))  # type: ignore[arg-type,return-value]
    for n, item in zip(slots, ordered, strict=True):
        items[n] = item


@pytest.fixture(autouse=True)
def _cluster_is_up(request: pytest.FixtureRequest) -> None:
    """A test of a host-process cluster never runs on one another tier took down."""
    for name in ("local", "dra_cluster"):
        if name in request.fixturenames:
            cluster = request.getfixturevalue(name)
            assert cluster.is_up, f"the {cluster.version} cluster was taken down before this test"
