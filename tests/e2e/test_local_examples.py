"""On a real kube-apiserver, kube-scheduler and kubelet: what a user applies, and what
they see. The examples run unchanged but for their image; the webhook refuses what
breaks a rule; the chart's RBAC is all our parts need; `kubectl inspect cgpu` works
from an ordinary shell.
"""

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.manifests import pods_from_manifests
from gpushare.objects import Pod
from gpushare.request import parse_pod_request
from tests.e2e.checks import (
    assert_env_matches_annotation,
    assert_placed_as_asked,
    assert_within_capacity,
    cluster_state,
)
from tests.e2e.kube import run, wait_for
from tests.e2e.local import (
    NODE,
    POLICY_KINDS,
    RBAC_KINDS,
    SYSTEM_NAMESPACE,
    WEBHOOK_KINDS,
    LocalCluster,
)
from tests.e2e.workloads import (
    BUSYBOX,
    WORKLOAD_LABEL,
    invalid_examples,
    manifests,
    runnable,
    unnamed_scheduler_pod,
    valid_examples,
)

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(600)]


@pytest.fixture(autouse=True)
def clean(local: LocalCluster) -> Iterator[None]:
    yield
    local.delete_all(WORKLOAD_LABEL)


def local_manifests(path: Path) -> list[dict[str, Any]]:
    return manifests(path, BUSYBOX, "IfNotPresent")


def test_the_charts_objects_are_accepted_by_the_api_server(local: LocalCluster):
    applied = RBAC_KINDS | POLICY_KINDS | WEBHOOK_KINDS
    others = [o for o in local.rendered if o["kind"] not in applied]
    assert {o["kind"] for o in others} >= {"DaemonSet", "Deployment", "Service", "ConfigMap"}
    result = local.apply(others, False, "--dry-run=server")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(others)


@pytest.mark.parametrize("component", ["scheduler", "node"])
def test_our_parts_run_as_the_charts_service_accounts(local: LocalCluster, component: str):
    kubeconfig = local.our_dir / f"{component}.kubeconfig"
    whoami = run(
        ["kubectl", "--kubeconfig", str(kubeconfig), "auth", "whoami", "-o", "json"]
    ).stdout
    user = json.loads(whoami)["status"]["userInfo"]["username"]
    [account] = [
        o["metadata"]["name"]
        for o in local.rendered
        if o["kind"] == "ServiceAccount"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    assert user == f"system:serviceaccount:{SYSTEM_NAMESPACE}:{account}"
    # and with only those rights, the plugin published the node's GPUs and nothing failed
    assert "gpushare.io/gpus" in local.get("node", NODE)["metadata"]["annotations"]
    for process in (local.extender, local.plugin):
        assert process is not None
        assert " 403" not in process.text() and "Forbidden" not in process.text()


@pytest.mark.parametrize("path", valid_examples(), ids=lambda p: p.stem)
def test_each_example_runs_with_the_environment_its_annotation_names(
    local: LocalCluster, path: Path
):
    documents = local_manifests(path)
    expected = len(pods_from_manifests(documents))
    local.apply(documents)
    pods = local.wait_running(WORKLOAD_LABEL, expected)
    for raw in pods:
        assert_placed_as_asked(Pod.model_validate(raw))
    wanted = sum(len(parse_pod_request(Pod.model_validate(p)).containers) for p in pods)
    assert assert_env_matches_annotation(local, pods) == wanted
    state, _ = cluster_state(local)
    assert_within_capacity(state)


@pytest.mark.parametrize("path", invalid_examples(), ids=lambda p: p.stem)
def test_an_invalid_example_is_refused_at_apply_time_naming_the_rule(
    local: LocalCluster, path: Path
):
    refused = local.apply(local_manifests(path), check=False)
    assert refused.returncode != 0, refused.stdout
    assert "denied the request" in refused.stderr
    assert "[core-multiple-of-5]" in refused.stderr
    for doc in local_manifests(path):
        missing = local.kubectl("get", "pod", doc["metadata"]["name"], check=False)
        assert "NotFound" in missing.stderr


def test_the_webhook_sends_a_gpu_pod_without_scheduler_name_to_ours(local: LocalCluster):
    pod = runnable(unnamed_scheduler_pod(), BUSYBOX, "IfNotPresent")
    local.create([pod])
    [running] = local.wait_running(WORKLOAD_LABEL, 1)
    assert running["spec"]["schedulerName"] == "gpushare-scheduler"
    assert assert_env_matches_annotation(local, [running]) == 1


def test_kubectl_inspect_cgpu_works_from_a_shell_with_kubeconfig(local: LocalCluster):
    documents = local_manifests(Path("examples/two-containers.yaml").resolve())
    local.apply(documents)
    [pod] = local.wait_running(WORKLOAD_LABEL, 1)
    # An ordinary shell: KUBECONFIG set, not inside a pod (no KUBERNETES_SERVICE_HOST).
    env = {k: v for k, v in local.env.items() if not k.startswith("KUBERNETES_")}
    env["PATH"] = f"{local.venv_bin}{os.pathsep}{env['PATH']}"
    summary = subprocess.run(
        ["kubectl", "inspect", "cgpu"], env=env, capture_output=True, text=True, timeout=60
    )
    assert summary.returncode == 0, summary.stderr
    state, _ = cluster_state(local)
    node = state.nodes[NODE]
    used = sum(node.used(g.index)[0] for g in node.inventory.gpus)
    assert used == 6  # 4 + 2 GiB for the app containers; the init container's 1 fits inside
    assert NODE in summary.stdout
    assert summary.stdout.splitlines()[-1].startswith(f"{used}/{node.inventory.total_mem} (")
    details = subprocess.run(
        ["kubectl", "inspect", "cgpu", "-d"], env=env, capture_output=True, text=True, timeout=60
    )
    assert details.returncode == 0, details.stderr
    assert pod["metadata"]["name"] in details.stdout


def test_a_pod_asking_for_a_whole_node_more_than_fits_waits_with_a_readable_reason(
    local: LocalCluster,
):
    """kube-scheduler formats the extender's reason with printf: a '%' in it became
    '%!c(MISSING)' in the event a user reads."""
    filler = runnable(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "compute-filler"},
            "spec": {
                "schedulerName": "gpushare-scheduler",
                "containers": [{"name": "app", "resources": {"limits": {
                    "aliyun.com/gpu-mem": 20, "aliyun.com/gpu-core.percentage": 95}}}],
            },
        },
        BUSYBOX,
        "IfNotPresent",
    )  # fmt: skip
    waiting = yaml.safe_load(yaml.safe_dump(filler))
    waiting["metadata"]["name"] = "compute-waiter"
    limits = waiting["spec"]["containers"][0]["resources"]["limits"]
    limits["aliyun.com/gpu-mem"] = 20
    limits["aliyun.com/gpu-core.percentage"] = 10
    local.create([filler])
    local.wait_running(WORKLOAD_LABEL, 1)
    local.create([waiting])

    def refusal() -> str | None:
        for event in local.events_for("compute-waiter"):
            if event["reason"] == "FailedScheduling":
                return event["message"]
        return None

    message = wait_for("a FailedScheduling event", refusal, timeout=60, every=1)
    assert "%" not in message, message
    assert "percent" in message, message


def test_cgpu_smi_shows_each_running_container_with_its_limits(local: LocalCluster):
    local.apply(local_manifests(Path("examples/cuda-sample.yaml").resolve()))
    pods = local.wait_running(WORKLOAD_LABEL, 3)
    names = {p["metadata"]["name"] for p in pods}

    def listed() -> dict[str, Any] | None:
        out = run(
            [str(local.venv_bin / "cgpu-smi"), "--control-dir", str(local.control_dir), "--json"]
        ).stdout
        view = json.loads(out)
        shown = {c["pod"].split("/")[-1]: c for g in view["gpus"] for c in g["containers"]}
        if not names <= set(shown):
            return None
        # Containers of pods deleted by earlier tests keep their fixed share until the
        # agent forgets them (forget_after_s), squeezing the others meanwhile.
        limits = {shown[name]["compute_limit_percent"] for name in names}
        return shown if limits == {30} else None

    shown = wait_for("the agent to show the three containers", listed, timeout=90, every=1)
    for name in names:
        assert shown[name]["memory_allocated_bytes"] == 2 * 1024**3, shown[name]


ACK_SAMPLES = sorted((Path(__file__).parent / "ack").glob("*.yaml"))


@pytest.mark.parametrize("path", ACK_SAMPLES, ids=lambda p: p.stem)
def test_acks_documented_samples_run_unchanged(local: LocalCluster, path: Path):
    """A cluster moves from ACK without rewriting a pod: the samples of ACK's
    documentation, including `schedulerName: ack-co-scheduler`, run as written."""
    [original] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    local.apply(local_manifests(path))
    [running] = local.wait_running(WORKLOAD_LABEL, 1, timeout=60)
    wanted = original["spec"]["template"]["spec"].get("schedulerName", "gpushare-scheduler")
    assert running["spec"]["schedulerName"] == wanted
    assert assert_env_matches_annotation(local, [running]) == 1
