"""On a real kube-apiserver: with the extender down, pods that ask for no GPU are
created as if gpushare were not installed, whatever the webhook's settings; pods that
ask for GPUs are refused (Fail) rather than slipping past the rules unchecked."""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.chart.rendering import webhook_configurations
from tests.e2e.local import SYSTEM_NAMESPACE, LocalCluster, webhooks_on_loopback
from tests.e2e.workloads import BUSYBOX, WORKLOAD_LABEL, gpu_pod

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(300)]


def plain_pod(name: str) -> dict[str, Any]:
    pod = gpu_pod(name, 1, image=BUSYBOX, pull_policy="IfNotPresent")
    pod["spec"].pop("schedulerName")
    del pod["spec"]["containers"][0]["resources"]
    return pod


@pytest.fixture
def extender_down(local: LocalCluster) -> Iterator[None]:
    assert local.extender is not None
    local.extender.stop()
    try:
        yield
    finally:
        local.start_extender()
        local.apply(webhooks_on_loopback(local.rendered, local.ca_pem))
        local.kubectl(
            "delete", "pods", "-l", WORKLOAD_LABEL, "--grace-period=0", "--force",
            "--ignore-not-found", "--wait=true",
        )  # fmt: skip


def test_with_the_chart_defaults_only_gpu_pods_depend_on_the_extender(
    local: LocalCluster, extender_down: None
):
    created = local.create([plain_pod("plain-defaults")], check=False)
    assert created.returncode == 0, created.stderr
    refused = local.create(
        [gpu_pod("gpu-while-down", 1, image=BUSYBOX, pull_policy="IfNotPresent")], check=False
    )
    assert refused.returncode != 0
    assert "failed calling webhook" in refused.stderr, refused.stderr


@pytest.mark.parametrize("values", [{"webhook": {"matchConditions": False}}], ids=["no-cel"])
def test_without_match_conditions_plain_pods_never_wait_for_the_extender(
    local: LocalCluster, extender_down: None, values: dict[str, Any]
):
    """Kubernetes < 1.28 has no matchConditions: every pod CREATE reaches the webhook, so
    the chart must not make them fail when the extender is down."""
    hooks = webhook_configurations(values, local.version, namespace=SYSTEM_NAMESPACE)
    assert all("matchConditions" not in w for h in hooks for w in h["webhooks"])
    local.apply(webhooks_on_loopback(hooks, local.ca_pem))
    created = local.create([plain_pod("plain-no-cel")], check=False)
    assert created.returncode == 0, created.stderr
    pod = local.get("pod", "plain-no-cel")
    assert pod["spec"]["schedulerName"] == "default-scheduler"
