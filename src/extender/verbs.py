"""Filter, prioritize and preempt: kube-scheduler's questions, answered from the cache.

Each function takes the parsed request and returns the encoded answer in the
exact shape of the extender API (C.3). Pods that ask for none of our resources
pass straight through; pods that break a rule are refused on every node with
the rule, as unresolvable, since no node and no amount of waiting can help.
"""

from typing import Any

from extender.cache import SchedulerCache
from extender.metrics import ExtenderMetrics
from extender.policychoice import pod_policy
from extender.wire import ExtenderArgs, PreemptionArgs, dumps, for_scheduler
from gpushare.errors import PodRefused
from gpushare.placement import Placement, evaluate
from gpushare.request import PodRequest, parse_pod_request
from gpushare.state import NodeState


def filter_nodes(cache: SchedulerCache, metrics: ExtenderMetrics, args: ExtenderArgs) -> bytes:
    names = args.candidates()
    try:
        request = parse_pod_request(args.pod)
    except PodRefused as refused:
        for refusal in refused.refusals:
            metrics.filter_rejections.labels(refusal.rule.value).inc(len(names))
        reason = for_scheduler(str(refused))
        reasons = dumps(dict.fromkeys(names, reason)).decode()
        return _answer_without_table(args, [], reasons)
    if request is None:
        return _answer_without_table(args, names, "{}")
    policy = pod_policy(args.pod.metadata.annotations)
    with cache.lock:
        cache.observe(args.pod.metadata.uid or args.pod.key, request, policy)
        answers = cache.answers(request, policy, names)
    for rule, count in answers.rules().items():
        metrics.filter_rejections.labels(rule).inc(count)
    failed, unresolvable = answers.failed_json(), answers.unresolvable_json()
    if args.node_names is not None:
        return _filter_answer("null", answers.passed_json(), failed, unresolvable)
    return _filter_answer(_echo(args, answers.passed()), "null", failed, unresolvable)


def _answer_without_table(args: ExtenderArgs, passed: list[str], unresolvable: str) -> bytes:
    if args.node_names is not None:
        return _filter_answer("null", dumps(passed).decode(), "{}", unresolvable)
    return _filter_answer(_echo(args, set(passed)), "null", "{}", unresolvable)


def _echo(args: ExtenderArgs, passed: set[str]) -> str:
    """The NodeList of the Node objects that passed, exactly as they were sent."""
    items = (args.nodes.items if args.nodes else None) or []
    echoed = [item for item in items if item["metadata"]["name"] in passed]
    return dumps({"metadata": {}, "items": echoed}).decode()


def _filter_answer(nodes: str, node_names: str, failed: str, unresolvable: str) -> bytes:
    """ExtenderFilterResult, from its parts already encoded."""
    return (
        f'{{"Nodes":{nodes},"NodeNames":{node_names},"FailedNodes":{failed},'
        f'"FailedAndUnresolvableNodes":{unresolvable},"Error":""}}'
    ).encode()


def prioritize_nodes(cache: SchedulerCache, args: ExtenderArgs) -> bytes:
    names = args.candidates()
    request = _request_or_none(args)
    if request is None:
        return dumps([{"Host": name, "Score": 0} for name in names])
    policy = pod_policy(args.pod.metadata.annotations)
    with cache.lock:
        answers = cache.answers(request, policy, names)
    return answers.priorities_json().encode()


def preempt_nodes(cache: SchedulerCache, args: PreemptionArgs) -> bytes:
    """Keeps the nodes where removing the scheduler's victims makes the pod fit by our
    rules, with the victims unchanged; drops the others. A node offered with no
    victims is dropped too: the scheduler treats an empty victim list as an error."""
    candidates = args.victims()
    kept: dict[str, Any] = {}
    try:
        request = parse_pod_request(args.pod)
    except PodRefused:
        return dumps({"NodeNameToMetaVictims": kept})  # fits nowhere, whoever is evicted
    policy = pod_policy(args.pod.metadata.annotations)
    with cache.lock:
        for node, (uids, violations) in candidates.items():
            if not uids:
                continue
            if request is not None and not _fits_without(cache, node, request, policy, set(uids)):
                continue
            kept[node] = {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": violations}
    return dumps({"NodeNameToMetaVictims": kept})


def _fits_without(
    cache: SchedulerCache, node: str, request: PodRequest, policy: str | None, uids: set[str]
) -> bool:
    state = cache.node_state(node)
    if state is None:
        return False
    trial = NodeState(state.inventory)
    for key, allocation in state.pods.items():
        if cache.pod_uid(key) not in uids:
            trial.add(key, allocation)
    return isinstance(evaluate(trial.view(), request, cache.policy_for(node, policy)), Placement)


def _request_or_none(args: ExtenderArgs) -> PodRequest | None:
    try:
        return parse_pod_request(args.pod)
    except PodRefused:
        return None
