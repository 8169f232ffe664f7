"""filter and prioritize over HTTP, as kube-scheduler calls them."""

import json
import re

import httpx

from gpushare.cluster.memory import gpu_node
from gpushare.errors import Rule
from gpushare.extender.answertable import AnswerTable
from gpushare.inventory import parse_layout
from tests.builders import node, pod
from tests.extender.harness import PREFIX, allocation_of, pod_json


def test_reasons_say_whether_waiting_can_help(cluster, scheduler_for):
    cluster.add_node(node("busy", "1x16GiB"))
    cluster.add_node(node("small", "1x8GiB"))
    cluster.add_node(node("plain", "1x16GiB", mode=None))
    s = scheduler_for()
    assert s.schedule(s.submit(pod("first", mem=14))) == "busy"

    answer = s.filter(s.submit(pod("second", mem=12)), ["busy", "small", "plain", "ghost"])

    assert answer["NodeNames"] == [] and answer["Nodes"] is None and answer["Error"] == ""
    assert set(answer["FailedNodes"]) == {"busy"}
    assert "insufficient-gpu-memory" in answer["FailedNodes"]["busy"]
    assert "2 GiB" in answer["FailedNodes"]["busy"]  # what is left, so the user can act
    unresolvable = answer["FailedAndUnresolvableNodes"]
    assert set(unresolvable) == {"small", "plain", "ghost"}
    assert "[gpu-too-small]" in unresolvable["small"]
    assert "ack.node.gpu.schedule" in unresolvable["plain"]
    assert "[node-unknown]" in unresolvable["ghost"]


def test_compute_needs_a_core_mem_node(cluster, scheduler_for):
    cluster.add_node(node("mem-only", "1x16GiB", mode="cgpu"))
    cluster.add_node(node("isolating", "1x16GiB", mode="core_mem"))
    s = scheduler_for()
    answer = s.filter(s.submit(pod("c", mem=2, core=30)))
    assert answer["NodeNames"] == ["isolating"]
    assert "[node-mode-no-compute]" in answer["FailedAndUnresolvableNodes"]["mem-only"]


def test_binpack_fills_the_fullest_gpu_and_node(cluster, scheduler_for):
    cluster.add_node(node("a", "2x16GiB"))
    cluster.add_node(node("b", "2x16GiB"))
    s = scheduler_for()
    assert s.schedule(s.submit(pod("p1", mem=4))) == "a"  # tie broken by name
    p2 = s.submit(pod("p2", mem=4))
    scores = s.prioritize(p2, ["a", "b"])
    assert scores["a"] > scores["b"]
    assert all(isinstance(v, int) and 0 <= v <= 10 for v in scores.values())
    assert s.schedule(p2) == "a"
    assert allocation_of(cluster, "default", "p1").gpu_indices == (0,)
    assert allocation_of(cluster, "default", "p2").gpu_indices == (0,)


def test_spread_picks_the_emptiest_gpu_and_node(cluster, scheduler_for):
    cluster.add_node(node("a", "2x16GiB", **{"ack.node.gpu.placement": "spread"}))
    cluster.add_node(node("b", "2x16GiB", **{"ack.node.gpu.placement": "spread"}))
    s = scheduler_for()
    assert s.schedule(s.submit(pod("p1", mem=4))) == "a"
    p2 = s.submit(pod("p2", mem=4))
    scores = s.prioritize(p2, ["a", "b"])
    assert scores["b"] > scores["a"]
    assert s.schedule(p2) == "b"
    assert s.schedule(s.submit(pod("p3", mem=4))) == "a"
    assert allocation_of(cluster, "default", "p1").gpu_indices == (0,)
    assert allocation_of(cluster, "default", "p3").gpu_indices == (1,)


def test_the_multi_gpu_label_splits_memory_over_gpus_of_one_node(cluster, scheduler_for):
    cluster.add_node(node("one", "1x80GiB"))
    cluster.add_node(node("four", "4x16GiB"))
    s = scheduler_for()
    split = s.submit(pod("split", mem=24, labels={"aliyun.com/gpu-count": "3"}))
    answer = s.filter(split)
    assert answer["NodeNames"] == ["four"]
    assert "[too-few-gpus]" in answer["FailedAndUnresolvableNodes"]["one"]
    assert s.schedule(split) == "four"
    allocation = allocation_of(cluster, "default", "split")
    assert [s.mem for s in allocation.containers[0].gpus] == [8, 8, 8]
    assert len(allocation.gpu_indices) == 3


def test_gpu_count_takes_whole_gpus_that_nobody_shares(cluster, scheduler_for):
    cluster.add_node(node("n", "2x16GiB"))
    s = scheduler_for()
    assert s.schedule(s.submit(pod("shared", mem=2))) == "n"
    assert s.schedule(s.submit(pod("whole", count=1))) == "n"
    assert allocation_of(cluster, "default", "whole").gpu_indices == (1,)

    second = s.filter(s.submit(pod("whole-2", count=1)))
    assert "[no-free-whole-gpu]" in second["FailedNodes"]["n"]
    # The shared pod's GPU still has room; the exclusive one has none to give.
    assert s.schedule(s.submit(pod("big-shared", mem=14))) == "n"
    assert allocation_of(cluster, "default", "big-shared").gpu_indices == (0,)
    assert "[insufficient-gpu-memory]" in s.filter(s.submit(pod("more", mem=1)))["FailedNodes"]["n"]


def test_at_most_the_configured_pods_share_a_gpu(cluster, scheduler_for):
    cluster.add_node(node("n", "1x80GiB"))
    s = scheduler_for()
    for i in range(20):
        assert s.schedule(s.submit(pod(f"p{i}", mem=1))) == "n"
    answer = s.filter(s.submit(pod("p20", mem=1)))
    assert "[pods-per-gpu-limit]" in answer["FailedNodes"]["n"]


def test_the_pod_limit_is_a_flag(cluster, scheduler_for):
    cluster.add_node(node("n", "1x80GiB"))
    s = scheduler_for(max_pods_per_gpu=2)
    for i in range(2):
        assert s.schedule(s.submit(pod(f"p{i}", mem=1))) == "n"
    assert "[pods-per-gpu-limit]" in s.filter(s.submit(pod("p2", mem=1)))["FailedNodes"]["n"]


def test_memory_only_and_compute_jobs_do_not_mix_on_a_node(cluster, scheduler_for):
    cluster.add_node(node("n", "2x16GiB", mode="core_mem"))
    s = scheduler_for()
    assert s.schedule(s.submit(pod("mem-only", mem=2))) == "n"
    answer = s.filter(s.submit(pod("with-core", mem=2, core=20)))
    assert "[job-type-mixing]" in answer["FailedNodes"]["n"]
    cluster.delete_pod("default", "mem-only")
    s2 = s.submit(pod("with-core-2", mem=2, core=20))
    assert s.schedule(s2) == "n"  # the node is free of memory-only jobs again
    assert "[job-type-mixing]" in s.filter(s.submit(pod("mem-2", mem=2)))["FailedNodes"]["n"]


def test_pods_without_our_resources_pass_straight_through(cluster, scheduler_for):
    cluster.add_node(node("gpu", "1x16GiB"))
    cluster.add_node(node("cpu", "1x16GiB", mode=None))
    s = scheduler_for()
    plain = pod("web", containers=[{"name": "nginx", "resources": {"limits": {"cpu": "1"}}}])
    answer = s.filter(plain, ["gpu", "cpu", "unknown"])
    assert answer["NodeNames"] == ["gpu", "cpu", "unknown"]
    assert answer["FailedNodes"] == {} and answer["FailedAndUnresolvableNodes"] == {}


def test_a_pod_that_breaks_a_rule_is_unresolvable_everywhere(cluster, scheduler_for):
    cluster.add_node(node("n", "1x16GiB", mode="core_mem"))
    s = scheduler_for()
    answer = s.filter(pod("core-33", mem=2, core=33), ["n"])
    assert answer["NodeNames"] == []
    assert "multiple of 5, got 33" in answer["FailedAndUnresolvableNodes"]["n"]


def test_not_node_cache_capable_echoes_the_node_objects_unchanged(cluster, scheduler_for):
    cluster.add_node(node("fits", "1x16GiB"))
    cluster.add_node(node("small", "1x4GiB"))
    s = scheduler_for()
    items = []
    for name in ("fits", "small"):
        manifest = cluster.get_node(name).to_manifest()
        manifest["metadata"]["managedFields"] = [{"manager": "kubelet", "operation": "Update"}]
        manifest["spec"] = {"podCIDR": "10.0.0.0/24"}
        items.append(manifest)
    body = {
        "Pod": pod_json(s.submit(pod("p", mem=8))),
        "Nodes": {"metadata": {}, "items": items},
        "NodeNames": None,
    }
    answer = s.post("filter", body).json()
    assert answer["NodeNames"] is None
    assert answer["Nodes"]["items"] == [items[0]]
    assert "[gpu-too-small]" in answer["FailedAndUnresolvableNodes"]["small"]
    scores = s.post("prioritize", body).json()
    assert [entry["Host"] for entry in scores] == ["fits", "small"]


def test_the_example_request_of_the_extender_api_is_understood(cluster, scheduler_for):
    for name in ("node-a", "node-b", "node-c"):
        cluster.add_node(gpu_node(name, parse_layout("1x16GiB", name)))
    s = scheduler_for()
    raw = (
        '{"Pod":{"metadata":{"name":"p1","namespace":"default","uid":"6f0c"},'
        '"spec":{"containers":[{"name":"c","resources":{"limits":'
        '{"aliyun.com/gpu-mem":"4"}}}]},"status":{}},'
        '"Nodes":null,"NodeNames":["node-a","node-b","node-c"]}'
    )
    response = s.http.post("/filter", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    answer = json.loads(response.content)
    assert list(answer) == [
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    ]
    assert answer["NodeNames"] == ["node-a", "node-b", "node-c"]


def test_the_url_prefix_is_a_flag(cluster, scheduler_for):
    cluster.add_node(node("n", "1x16GiB"))
    s = scheduler_for(url_prefix="/custom/")
    base = s.server.url
    body = {"Pod": pod_json(pod("p", mem=1)), "Nodes": None, "NodeNames": ["n"]}
    assert s.http.post(base + "/custom/filter", json=body).json()["NodeNames"] == ["n"]
    assert s.http.post(base + PREFIX + "/filter", json=body).status_code == 404


def node_objects(s, *names: str) -> list[dict]:
    """The Node objects a scheduler that is not node-cache-capable sends, in full."""
    return [s.cluster.get_node(name).to_manifest() for name in names]


def test_not_node_cache_capable_a_pod_without_our_resources_gets_every_node_back(
    cluster, scheduler_for
):
    cluster.add_node(node("gpu", "1x16GiB"))
    cluster.add_node(node("cpu", "1x16GiB", mode=None))
    s = scheduler_for()
    items = node_objects(s, "gpu", "cpu")
    plain = pod("web", containers=[{"name": "nginx", "resources": {"limits": {"cpu": "1"}}}])
    body = {"Pod": pod_json(plain), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    assert s.post("filter", body).json() == {
        "Nodes": {"metadata": {}, "items": items},
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_not_node_cache_capable_a_pod_that_breaks_a_rule_gets_no_node_back(cluster, scheduler_for):
    cluster.add_node(node("a", "1x16GiB", mode="core_mem"))
    cluster.add_node(node("b", "1x16GiB", mode="core_mem"))
    s = scheduler_for()
    items = node_objects(s, "a", "b")
    bad = pod("core-33", mem=2, core=33)
    body = {"Pod": pod_json(bad), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    answer = s.post("filter", body).json()
    reason = answer["FailedAndUnresolvableNodes"]["a"]
    assert "multiple of 5, got 33" in reason
    assert answer == {
        "Nodes": {"metadata": {}, "items": []},
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {"a": reason, "b": reason},
        "Error": "",
    }


def test_not_node_cache_capable_the_passing_node_objects_come_back_in_a_node_list(
    cluster, scheduler_for
):
    cluster.add_node(node("fits", "1x16GiB"))
    s = scheduler_for()
    items = node_objects(s, "fits")
    body = {
        "Pod": pod_json(s.submit(pod("p", mem=8))),
        "Nodes": {"metadata": {}, "items": items},
        "NodeNames": None,
    }
    assert s.post("filter", body).json()["Nodes"] == {"metadata": {}, "items": items}


def test_a_filter_call_without_any_candidate_gets_an_empty_answer(cluster, scheduler_for):
    cluster.add_node(node("n", "1x16GiB"))
    s = scheduler_for()
    body = {"Pod": pod_json(s.submit(pod("p", mem=8))), "Nodes": None, "NodeNames": None}
    response = s.post("filter", body)
    assert response.status_code == 200
    assert response.json() == {
        "Nodes": {"metadata": {}, "items": []},
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def rejections(s) -> dict[str, float]:
    """gpushare_extender_filter_rejections_total per rule, from /metrics."""
    text = httpx.get(f"{s.server.url}/metrics").text
    found = re.findall(
        r'^gpushare_extender_filter_rejections_total\{rule="([^"]+)"\} (\S+)$', text, re.M
    )
    return {rule: float(value) for rule, value in found}


def test_metrics_count_the_nodes_filter_refused_by_rule(cluster, scheduler_for):
    cluster.add_node(node("busy", "1x16GiB"))
    cluster.add_node(node("small", "1x8GiB"))
    s = scheduler_for()
    assert s.schedule(s.submit(pod("first", mem=14))) == "busy"
    s.filter(s.submit(pod("second", mem=12)), ["busy", "small", "ghost"])
    s.filter(pod("broken", core=33), ["busy", "small", "ghost"])
    counted = {
        "insufficient-gpu-memory": 1.0,
        "gpu-too-small": 2.0,  # small refused first too
        "node-unknown": 1.0,
        "core-multiple-of-5": 3.0,
        "core-needs-gpu-mem": 3.0,
    }
    # Every other rule's series is there at 0, so its first rejection shows as an increase.
    assert rejections(s) == {rule.value: counted.get(rule.value, 0.0) for rule in Rule}


def test_prioritize_scores_a_pod_without_our_resources_zero_everywhere(cluster, scheduler_for):
    cluster.add_node(node("gpu", "1x16GiB"))
    s = scheduler_for()
    plain = pod("web", containers=[{"name": "nginx", "resources": {"limits": {"cpu": "1"}}}])
    body = {"Pod": pod_json(plain), "Nodes": None, "NodeNames": ["gpu", "unknown"]}
    assert s.post("prioritize", body).json() == [
        {"Host": "gpu", "Score": 0},
        {"Host": "unknown", "Score": 0},
    ]


def test_prioritize_scores_the_nodes_a_pod_does_not_fit_on_zero(cluster, scheduler_for):
    # kube-scheduler may ask for nodes its other filters passed: a node the pod does
    # not fit on, or one the extender does not know, must not outscore nothing.
    cluster.add_node(node("fits", "1x16GiB"))
    cluster.add_node(node("small", "1x8GiB"))
    s = scheduler_for()
    scores = s.prioritize(s.submit(pod("big", mem=12)), ["fits", "small", "ghost"])
    assert scores["small"] == 0 and scores["ghost"] == 0
    assert scores["fits"] > 0


def test_prioritize_of_filter_passed_nodes_answers_as_any_written_list(cluster, scheduler_for):
    """kube-scheduler sends prioritize the nodes filter passed, as filter wrote them
    (compact JSON, in order): that list, recognised from filter's answer, gets the
    answer the same names written any other way get, also after a bind between."""
    for i in range(6):
        cluster.add_node(node(f"n{i}", "2x16GiB"))
    cluster.add_node(node("small", "1x8GiB"))
    s = scheduler_for()
    assert s.bind(s.submit(pod("first", mem=6)), "n0") == ""
    asking = s.submit(pod("asking", mem=10))
    passed = s.filter(asking)["NodeNames"]
    assert "small" not in passed and len(passed) == 6

    def both_ways() -> tuple[list, list]:
        head = f'{{"Pod":{json.dumps(pod_json(asking), separators=(",", ":"))},"Nodes":null'
        as_go = f'{head},"NodeNames":{json.dumps(passed, separators=(",", ":"))}}}'
        spaced = f'{head}, "NodeNames": {json.dumps(passed)}}}'
        json_type = {"Content-Type": "application/json"}
        answers = [
            s.http.post("/prioritize", content=body, headers=json_type).json()
            for body in (as_go, spaced)
        ]
        return answers[0], answers[1]

    compact, spaced = both_ways()
    assert compact == spaced and [p["Host"] for p in compact] == passed
    assert s.schedule(s.submit(pod("between", mem=12))) in passed
    compact, spaced = both_ways()
    assert compact == spaced and [p["Host"] for p in compact] == passed


def test_the_same_candidates_in_another_order_get_the_same_answer(cluster, scheduler_for):
    """kube-scheduler lists the candidates in the order its parallel filter finishes:
    each order gets the answer the first one got, naming the same nodes."""
    for i in range(8):
        cluster.add_node(node(f"n{i}", "1x16GiB" if i % 2 else "1x8GiB"))
    s = scheduler_for()
    asking = s.submit(pod("asking", mem=10))
    names = [f"n{i}" for i in range(8)]
    first = s.filter(asking, names)
    assert set(first["NodeNames"]) == {"n1", "n3", "n5", "n7"}
    for order in (names[::-1], names[3:] + names[:3]):
        again = s.filter(asking, order)
        assert again == first
    # A bind between: the answer follows the node that changed, in any order.
    assert s.schedule(s.submit(pod("big", mem=14))) in first["NodeNames"]
    after = s.filter(asking, names[::-1])
    assert len(after["NodeNames"]) == 3 and s.filter(asking, names) == after


def test_prioritize_after_filter_is_answered_from_filters_answer(
    cluster, scheduler_for, monkeypatch
):
    """filter tells the reader which list prioritize brings back: prioritize then needs
    no look-up node by node (AnswerTable.answers), whatever else changes."""
    for i in range(4):
        cluster.add_node(node(f"n{i}", "2x16GiB"))
    s = scheduler_for()
    asking = s.submit(pod("asking", mem=10))
    passed = s.filter(asking)["NodeNames"]
    expected = s.prioritize(asking, passed)

    def no_look_up(*args: object) -> None:
        raise AssertionError("prioritize looked its nodes up one by one")

    monkeypatch.setattr(AnswerTable, "answers", no_look_up)
    assert s.prioritize(asking, passed) == expected
