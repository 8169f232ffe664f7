"""The chart's life on kind, by the same scenarios as the local cluster's chart tier
(tests/e2e/chart_scenarios.py): components and GPUs, the first GPU pod, leader
failover both ways, the node pod deleted mid-admission, upgrade from the previous
commit's chart, uninstall. Runs after test_kind.py (uninstall is last).

On a cluster GPUSHARE_E2E_KUBECONFIG names, which this suite did not install, they
skip: they kill our pods, upgrade and uninstall the release.
"""

from pathlib import Path

import pytest

from tests.e2e import chart_scenarios as scenario
from tests.e2e.chart_scenarios import Installed
from tests.e2e.conftest import MOCK_GPUS, Deployed
from tests.e2e.helm import previous_chart
from tests.e2e.workloads import WORKLOAD_LABEL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def installed(deployed: Deployed) -> Installed:
    if deployed.installed is None:
        pytest.skip(
            "GPUSHARE_E2E_KUBECONFIG names a cluster this suite did not install: the chart "
            "scenarios (failover, upgrade, uninstall) would act on the operator's release"
        )
    return deployed.installed


@pytest.fixture(autouse=True)
def clean(deployed: Deployed):
    yield
    deployed.kind.delete_all(WORKLOAD_LABEL)


def test_install_runs_every_component_and_advertises_the_gpus(installed: Installed):
    count, size = (int(x) for x in MOCK_GPUS.removesuffix("GiB").split("x"))
    scenario.components_run_and_gpus_are_advertised(installed, count * size, count)


@pytest.mark.parametrize("how", ["delete", "kill"])
def test_the_standby_scheduler_binds_gpu_pods_when_the_leader_goes(installed: Installed, how):
    failover = scenario.leader_failover(installed, how)
    print(f"\nleader {how}d: a GPU pod was bound {failover.bound_after_s:.1f}s after")


def test_the_plugins_pod_deleted_mid_admission_comes_back_and_loses_no_slice(
    installed: Installed, deployed: Deployed
):
    [node] = [n for n, mode in deployed.workers.items() if mode == "core_mem"]
    scenario.plugin_pod_deleted_mid_admission(installed, node)


def test_helm_upgrade_from_the_previous_commits_chart_keeps_every_allocation(
    installed: Installed, tmp_path: Path
):
    chart = previous_chart(tmp_path)
    if chart is None:
        pytest.skip(
            "no previous commit in this checkout (a shallow clone): nothing to upgrade from"
        )
    scenario.upgrade_keeps_every_allocation(installed, chart)


def test_helm_uninstall_leaves_nothing_of_ours(installed: Installed):
    scenario.uninstall_leaves_nothing_of_ours(installed)
