"""The demo's extender stage: admission through the webhook, placement through the
scheduler stand-in, all over HTTP on loopback."""

from gpushare.cli.demo.extender import ExtenderStage
from gpushare.cli.main import main
from gpushare.cluster.memory import MemoryCluster
from gpushare.objects import Pod
from gpushare.standins.scheduler import SchedulerStandIn
from tests.builders import node, pod


def test_the_demo_places_through_the_extender_and_shows_refusals_and_pending(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "Scheduling through the extender http://127.0.0.1:" in out
    assert "default/core-33 refused by the admission webhook" in out
    assert "[core-multiple-of-5]" in out
    assert "default/llm-0 -> gpu-node-3 GPU 0" in out
    pending = out.split("default/llm-1 stays Pending:")[1]
    assert "gpu-node-1: " in pending and "[gpu-too-small]" in pending
    assert "gpu-node-3: " in pending and "[insufficient-gpu-memory]" in pending


def test_the_stage_sends_gpu_pods_to_our_scheduler_before_placing_them():
    cluster = MemoryCluster()
    cluster.add_node(node("n", "1x16GiB"))
    with ExtenderStage(cluster) as stage:
        line = stage.submit(pod("p", mem=2))  # no schedulerName: the webhook sets ours
        assert line == "default/p -> n GPU 0 (main: 2 GiB on one GPU)"
        assert cluster.get_pod("default", "p").spec.scheduler_name == "gpushare-scheduler"


def test_the_stand_in_schedules_only_its_own_pending_pods_oldest_first():
    cluster = MemoryCluster()
    cluster.add_node(node("a", "1x16GiB"))
    cluster.add_node(node("b", "1x16GiB"))
    with ExtenderStage(cluster) as stage:
        for name, scheduler in (
            ("x", "gpushare-scheduler"),
            ("other", "default-scheduler"),
            ("y", "gpushare-scheduler"),
        ):
            manifest = pod(name, mem=10).to_manifest()
            manifest["spec"]["schedulerName"] = scheduler
            cluster.create_pod(Pod.model_validate(manifest))
        standin = SchedulerStandIn(cluster, stage.scheduler.extender_url)
        assert [p.metadata.name for p in standin.pending()] == ["x", "y"]
        outcomes = standin.schedule_pending()
        assert [(o.pod, o.node) for o in outcomes] == [("default/x", "a"), ("default/y", "b")]
        assert standin.pending() == []
