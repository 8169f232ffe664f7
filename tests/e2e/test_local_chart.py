"""`helm install` for real: the chart, our image and its pods on a real cluster.

The local cluster in bridge mode (tests/e2e/bridge.py) on each Kubernetes version of
the matrix, installed from the release's artifacts as docs/install.md says: the image
archive imported into the node's containerd, the packaged chart (.tgz) installed with
its default image, upgraded and uninstalled by Helm. The scenarios are tests/e2e/chart_scenarios.py,
shared with the kind suite. They run in this file's order: install, workloads,
failovers, the plugin's pod, upgrade, uninstall.
"""

import dataclasses
import io
import json
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e import chart_scenarios as scenario
from tests.e2e.artifacts import Artifacts
from tests.e2e.bridge import GPU_COUNT, ChartCluster
from tests.e2e.chart_scenarios import Installed
from tests.e2e.helm import previous_chart
from tests.e2e.kube import ROOT, run
from tests.e2e.local import GPU_SIZES, NODE
from tests.e2e.workloads import WORKLOAD_LABEL, invalid_examples, valid_examples
from tests.test_dockerfile import DOCKERFILE, OFFLINE, parse

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(900)]

IMAGE_SIZE_LIMIT_MIB = 350
DONE = {"delete": "pod deleted", "kill": "containers killed"}
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.fixture(scope="module")
def installed(chart_cluster: ChartCluster) -> Installed:
    return chart_cluster.installed()


@pytest.fixture(autouse=True)
def clean(chart_cluster: ChartCluster) -> Iterator[None]:
    yield
    chart_cluster.kubectl(
        "delete", "jobs,pods", "-l", WORKLOAD_LABEL, "--grace-period=0", "--force",
        "--ignore-not-found", "--wait=true", "--timeout=120s", timeout=150,
    )  # fmt: skip


def image_layer(archive: Path) -> tuple[dict[str, Any], bytes]:
    with tarfile.open(archive) as outer:
        index = json.load(outer.extractfile("index.json"))  # type: ignore[arg-type]

        def blob(digest: str) -> bytes:
            return outer.extractfile("blobs/sha256/" + digest.split(":")[1]).read()  # type: ignore[union-attr]

        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        [layer] = manifest["layers"]
        return config, blob(layer["digest"])


def test_the_release_verifies_and_its_image_is_the_charts_default(release_artifacts: Artifacts):
    checked = subprocess.run(
        ["sha256sum", "--check", "--strict", "SHA256SUMS"],
        cwd=release_artifacts.directory, capture_output=True, text=True,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{release_artifacts.image_archive.name}: OK" in checked.stdout
    with tarfile.open(release_artifacts.chart) as chart:
        values = yaml.safe_load(chart.extractfile("gpushare/values.yaml"))  # type: ignore[arg-type]
        meta = yaml.safe_load(chart.extractfile("gpushare/Chart.yaml"))  # type: ignore[arg-type]
    default = OFFLINE.full_name(
        f"{values['image']['repository']}:{values['image']['tag'] or meta['appVersion']}"
    )
    with tarfile.open(release_artifacts.image_archive) as archive:
        [manifest] = json.load(archive.extractfile("index.json"))["manifests"]  # type: ignore[arg-type]
    assert manifest["annotations"]["io.containerd.image.name"] == default
    assert manifest["digest"] == release_artifacts.image_digest


def test_the_image_built_offline_is_the_dockerfiles_and_small(release_artifacts: Artifacts):
    runtime = parse(DOCKERFILE.read_text())[-1]
    config, blob = image_layer(release_artifacts.image_archive)
    with tarfile.open(fileobj=io.BytesIO(blob)) as layer:
        names = set(layer.getnames())
    settings = config["config"]
    assert settings["User"] == runtime.args("USER")[-1]
    assert settings["Cmd"] == json.loads(runtime.args("CMD")[-1])
    path = next(e for e in settings["Env"] if e.startswith("PATH="))
    assert f"PATH={path.removeprefix('PATH=')}" in " ".join(runtime.args("ENV"))
    venv = "opt/gpushare"
    for script in SCRIPTS:
        assert f"{venv}/bin/{script}" in names, f"{script} is not in the image"
    site = f"{venv}/lib/python3.11/site-packages"
    # The release's own wheel, not one built again from the tree.
    assert f"{site}/kube_gpushare-{release_artifacts.version}.dist-info" in names
    for absent in ("matplotlib", "numpy", "pip", "kubernetes/aio"):
        assert f"{site}/{absent}" not in names, f"{absent} is in the image"
    [copy] = [c for c in runtime.args("COPY") if c.startswith("examples ")]
    examples = copy.split()[1].lstrip("/")
    assert {f"{examples}/{p.name}" for p in (ROOT / "examples").glob("*.yaml")} <= names
    size_mib = len(blob) / 2**20
    print(f"\nimage: {size_mib:.0f} MiB unpacked")
    assert size_mib <= IMAGE_SIZE_LIMIT_MIB


def test_install_runs_every_component_and_advertises_the_gpus(
    installed: Installed, release_artifacts: Artifacts, chart_cluster: ChartCluster
):
    scenario.components_run_and_gpus_are_advertised(installed, sum(GPU_SIZES), GPU_COUNT)
    # The node's containerd holds the archive's image under the chart's default name,
    # by the release's manifest digest, as docs/install.md has the operator check ...
    listed = run(
        ["ctr", "--address", str(chart_cluster.containerd_socket), "-n", "k8s.io", "images",
         "ls", f"name=={release_artifacts.image_reference}"],
        timeout=60,
    ).stdout.splitlines()  # fmt: skip
    [row] = [line.split() for line in listed[1:]]
    assert row[:3] == [
        release_artifacts.image_reference,
        "application/vnd.oci.image.manifest.v1+json",
        release_artifacts.image_digest,
    ]
    # ... and every container of ours runs it: the kubelet names an image imported
    # without a registry by its ID, the config's digest.
    with tarfile.open(release_artifacts.image_archive) as archive:
        blob = archive.extractfile("blobs/sha256/" + release_artifacts.image_digest[7:])
        image_id = json.load(blob)["config"]["digest"]  # type: ignore[arg-type]
    ours = [
        status
        for component in ("node", "scheduler")
        for pod in installed.component_pods(component)
        for status in pod["status"]["containerStatuses"]
        if status["image"] == release_artifacts.image_reference
    ]
    assert len(ours) >= 3, "the chart's pods do not run the released image"
    for status in ours:
        assert status["imageID"] == image_id, status


def test_a_gpu_pod_runs_soon_after_install(installed: Installed):
    took = scenario.first_gpu_pod_runs(installed)
    print(f"\nhelm install -> first GPU pod Running: {took:.1f}s")


@pytest.mark.parametrize("path", valid_examples(), ids=lambda p: p.stem)
def test_each_example_runs_with_the_environment_its_annotation_names(
    installed: Installed, path: Path
):
    scenario.example_runs_with_env_matching_annotation(installed, path)


@pytest.mark.parametrize("path", invalid_examples(), ids=lambda p: p.stem)
def test_the_webhook_behind_its_service_refuses_a_pod_naming_the_rule(
    installed: Installed, path: Path
):
    scenario.invalid_example_is_refused_naming_the_rule(installed, path)


def test_ordinary_pods_cannot_reach_the_scheduler_verbs_while_kube_scheduler_can(
    installed: Installed,
):
    outcomes = scenario.scheduler_verbs_refused_to_ordinary_pods(installed)
    print(f"\nverbs from an ordinary pod: {outcomes}")


@pytest.mark.parametrize("how", ["delete", "kill"])
def test_the_standby_scheduler_binds_gpu_pods_when_the_leader_goes(installed: Installed, how):
    failover = scenario.leader_failover(installed, how)
    leaders = f"{failover.old_holder.split('_')[0]} -> {failover.new_holder.split('_')[0]}"
    refused = ", ".join(f"{s:.1f}s" for s in failover.webhook_failures_s) or "none"
    print(
        f"\nleader {DONE[how]} ({leaders}): a GPU pod was bound"
        f" {failover.bound_after_s:.1f}s after; webhook calls to the dead endpoint: {refused}"
    )
    if how == "delete":
        # A deleted pod leaves the Service's endpoints at once: no call may fail.
        assert failover.webhook_failures_s == []


def test_the_plugins_pod_deleted_mid_admission_comes_back_and_loses_no_slice(
    installed: Installed,
):
    running, rejected = scenario.plugin_pod_deleted_mid_admission(installed, NODE)
    print(f"\nnode pod deleted mid-admission: {running} Running, {rejected} rejected and replaced")


def test_helm_upgrade_from_the_previous_commits_chart_keeps_every_allocation(
    installed: Installed, release_artifacts: Artifacts, tmp_path: Path
):
    chart = previous_chart(tmp_path)
    if chart is None:
        pytest.skip(
            "no previous commit in this checkout (a shallow clone): nothing to upgrade from"
        )
    # The previous commit's chart from git, upgraded to the release's .tgz. Its pods run
    # the released image too (the previous commit's image is not built; its appVersion
    # may be the version before a bump).
    pinned = {**installed.values, "image": {"tag": release_artifacts.version}}
    took = scenario.upgrade_keeps_every_allocation(
        dataclasses.replace(installed, values=pinned), chart
    )
    print(f"\nhelm upgrade (every pod of ours replaced, --wait): {took:.1f}s")


def test_helm_uninstall_leaves_nothing_of_ours(installed: Installed):
    checked = scenario.uninstall_leaves_nothing_of_ours(installed)
    assert len(checked) >= 10
