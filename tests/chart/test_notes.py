"""What `helm install` prints (NOTES.txt) and the kube-scheduler image it picks: the
defaults work or the notes say why not. Rendered by Helm's own engine; LIVE_CLUSTER
renders as against an API server, without it as `helm template` does."""

import re

import pytest
import yaml

from tests.chart.rendering import CHART, LIVE_CLUSTER, container, render

APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
ARCHIVE = f"gpushare-image-{APP_VERSION}.oci.tar"
SCHEDULER_TEMPLATE = "gpushare/templates/scheduler-deployment.yaml"
OUR_REGISTRY = {"image": {"repository": "registry.example.com/gpushare"}}


def flat(notes: str) -> str:
    return " ".join(notes.split())


def scheduler_image(rendered) -> str:
    spec = rendered.one("Deployment")["spec"]["template"]["spec"]
    return container(spec, "kube-scheduler")["image"]


# ----- the image nobody publishes


@pytest.mark.parametrize("repository", ["docker.io/gpushare/gpushare", "gpushare/gpushare"])
def test_the_default_image_is_named_with_what_to_do_about_it(repository):
    rendered = render({"image": {"repository": repository}}, api_versions=LIVE_CLUSTER)
    notes = flat(rendered.notes)
    image = f"{repository}:{APP_VERSION}"
    assert f"WARNING: the image {image} is the chart's default, and no registry serves it" in notes
    assert f"ctr -n k8s.io images import {ARCHIVE}" in notes
    assert f"kind load image-archive {ARCHIVE}" in notes
    assert f"skopeo copy oci-archive:{ARCHIVE} docker://<REGISTRY>/gpushare:{APP_VERSION}" in notes
    assert "--set image.repository=<REGISTRY>/gpushare" in notes
    assert "ErrImagePull or ImagePullBackOff" in notes
    assert f'describe pod <POD> # Events: Failed to pull image "{image}"' in notes
    pods = [rendered.one("DaemonSet"), rendered.one("Deployment")]
    used = {c["image"] for p in pods for c in p["spec"]["template"]["spec"]["containers"]}
    assert image in used


def test_the_chart_default_is_the_reference_the_image_archive_carries():
    with open(CHART / "values.yaml") as values:
        assert yaml.safe_load(values)["image"]["repository"] == "docker.io/gpushare/gpushare"


def test_an_image_of_your_registry_brings_no_image_warning():
    notes = render(OUR_REGISTRY, api_versions=LIVE_CLUSTER).notes
    assert "ImagePullBackOff" not in notes and ARCHIVE not in notes
    assert "WARNING" not in notes


def test_pull_policy_always_with_an_imported_image_is_called_out():
    notes = flat(render({"image": {"pullPolicy": "Always"}}).notes)
    assert "image.pullPolicy is Always: the kubelet then pulls even an imported image" in notes
    assert "image.pullPolicy is Always" not in flat(render().notes)


# ----- facts the notes state


def test_the_notes_give_the_placement_that_applies_not_binpack():
    notes = flat(render().notes)
    assert "a pod gets: fgd-lookahead (extender.defaultPlacement, the default" in notes
    assert "default binpack" not in notes
    chosen = flat(render({"extender": {"defaultPlacement": "binpack"}}).notes)
    assert "Which GPU of a node a pod gets: binpack (extender.defaultPlacement)." in chosen


def test_the_kubectl_plugin_comes_from_the_releases_wheel():
    notes = render().notes
    assert f"pip install ./kube_gpushare-{APP_VERSION}-*.whl" in notes
    assert "pip install kube-gpushare" not in notes


# ----- the kube-scheduler image follows the cluster


@pytest.mark.parametrize(
    ("cluster", "tag"),
    [
        ("v1.33.3", "v1.33.3"),
        ("v1.28.7", "v1.28.7"),
        ("v1.30.2-eks-1552ad0", "v1.30.2"),
        ("v1.30.5-gke.1014001", "v1.30.5"),
        ("v1.30.2+k3s1", "v1.30.2"),
        ("v1.34.0-rc.1", "v1.34.0-rc.1"),
    ],
)
def test_the_scheduler_is_the_api_servers_own_release_and_the_notes_say_so(cluster, tag):
    rendered = render(kube_version=cluster, api_versions=LIVE_CLUSTER)
    image = f"registry.k8s.io/kube-scheduler:{tag}"
    assert scheduler_image(rendered) == image
    notes = flat(rendered.notes)
    assert f"The scheduler runs {image}: it follows the cluster's Kubernetes {cluster}" in notes
    assert "set scheduler.image.tag to pin it" in notes
    assert "rendered without a cluster" not in notes
    assert "WARNING" not in rendered.manifests[SCHEDULER_TEMPLATE]


@pytest.mark.parametrize(
    ("pinned", "warning"),
    [
        ("v1.33.0", None),
        ("v1.32.9", None),
        ("v1.34.1", "is newer than the API server (v1.33.3)"),
        ("v2.0.0", "is newer than the API server (v1.33.3)"),
        ("v1.31.12", "is more than one minor version older than the API server (v1.33.3)"),
        ("latest", None),
    ],
)
def test_a_pinned_scheduler_is_kept_and_a_skew_the_policy_forbids_is_called_out(pinned, warning):
    rendered = render(
        {"scheduler": {"image": {"tag": pinned}}}, kube_version="v1.33.3", api_versions=LIVE_CLUSTER
    )
    assert scheduler_image(rendered) == f"registry.k8s.io/kube-scheduler:{pinned}"
    notes = flat(rendered.notes)
    assert f"kube-scheduler:{pinned}, pinned by scheduler.image.tag" in notes
    if warning is None:
        assert "WARNING" not in notes.replace("WARNING: the image", "")
    else:
        assert f"WARNING: kube-scheduler {pinned} {warning}" in notes


def test_rendered_without_a_cluster_the_notes_and_the_manifest_say_the_version_is_a_guess():
    rendered = render(kube_version="v1.31.4")
    assert scheduler_image(rendered) == "registry.k8s.io/kube-scheduler:v1.31.4"
    notes = flat(rendered.notes)
    assert "WARNING: rendered without a cluster (helm template): v1.31.4 is --kube-version" in notes
    assert "--kube-version <your API server's version>" in notes
    comment = rendered.manifests[SCHEDULER_TEMPLATE]
    assert re.search(
        r"^# WARNING: rendered without a cluster: kube-scheduler v1\.31\.4", comment, re.M
    )
    pinned = render({"scheduler": {"image": {"tag": "v1.31.4"}}}, kube_version="v1.31.4")
    assert "WARNING" not in pinned.manifests[SCHEDULER_TEMPLATE]
    assert "rendered without a cluster" not in pinned.notes
