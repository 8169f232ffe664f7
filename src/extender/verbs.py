"""Filter, prioritize and preempt: kube-scheduler's questions, answered from the cache.

Each function takes the parsed request and returns the JSON-ready answer in the
exact shape of the extender API (C.3). Pods that ask for none of our resources
pass straight through; pods that break a rule are refused on every node with
the rule, as unresolvable, since no node and no amount of waiting can help.
"""

from collections import Counter
from typing import Any

from extender.cache import SchedulerCache
from extender.metrics import ExtenderMetrics
from extender.policychoice import pod_policy
from extender.wire import ExtenderArgs, PreemptionArgs
from gpushare.errors import PodRefused
from gpushare.placement import Placement, evaluate
from gpushare.request import PodRequest, parse_pod_request
from gpushare.state import NodeState


def filter_nodes(
    cache: SchedulerCache, metrics: ExtenderMetrics, args: ExtenderArgs
) -> dict[str, Any]:
    names = args.candidates()
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    try:
        request = parse_pod_request(args.pod)
    except PodRefused as refused:
        reason = str(refused)
        unresolvable = dict.fromkeys(names, reason)
        for refusal in refused.refusals:
            metrics.filter_rejections.labels(refusal.rule.value).inc(len(names))
        return _filter_answer(args, [], failed, unresolvable)
    if request is None:
        return _filter_answer(args, names, failed, unresolvable)
    policy = pod_policy(args.pod.metadata.annotations)
    rules: Counter[str] = Counter()
    with cache.lock:
        cache.observe(args.pod.metadata.uid or args.pod.key, request, policy)
        fits = cache.fits(request, policy, names)
    for name, fit in zip(names, fits, strict=True):
        refusal = fit.refusal
        if refusal is None:
            passed.append(name)
        else:
            rules[refusal.rule] += 1
            if refusal.rule.resolvable:
                failed[name] = fit.reason
            else:
                unresolvable[name] = fit.reason
    for rule, count in rules.items():
        metrics.filter_rejections.labels(rule.value).inc(count)
    return _filter_answer(args, passed, failed, unresolvable)


def _filter_answer(
    args: ExtenderArgs, passed: list[str], failed: dict[str, str], unresolvable: dict[str, str]
) -> dict[str, Any]:
    if args.node_names is not None:
        nodes = None
        node_names: list[str] | None = passed
    else:
        keep = set(passed)
        items = (args.nodes.items if args.nodes else None) or []
        nodes = {"metadata": {}, "items": [i for i in items if i["metadata"]["name"] in keep]}
        node_names = None
    return {
        "Nodes": nodes,
        "NodeNames": node_names,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }


def prioritize_nodes(cache: SchedulerCache, args: ExtenderArgs) -> list[dict[str, Any]]:
    names = args.candidates()
    request = _request_or_none(args)
    if request is None:
        return [{"Host": name, "Score": 0} for name in names]
    policy = pod_policy(args.pod.metadata.annotations)
    with cache.lock:
        fits = cache.fits(request, policy, names)
    return [{"Host": name, "Score": fit.score} for name, fit in zip(names, fits, strict=True)]


def preempt_nodes(cache: SchedulerCache, args: PreemptionArgs) -> dict[str, Any]:
    """Keeps the nodes where removing the scheduler's victims makes the pod fit by our
    rules, with the victims unchanged; drops the others. A node offered with no
    victims is dropped too: the scheduler treats an empty victim list as an error."""
    candidates = args.victims()
    request = _request_or_none(args)
    kept: dict[str, Any] = {}
    policy = pod_policy(args.pod.metadata.annotations)
    with cache.lock:
        for node, (uids, violations) in candidates.items():
            if not uids:
                continue
            if request is not None and not _fits_without(cache, node, request, policy, set(uids)):
                continue
            kept[node] = {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": violations}
    return {"NodeNameToMetaVictims": kept}


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


def _request_or_none(args: ExtenderArgs | PreemptionArgs) -> PodRequest | None:
    try:
        return parse_pod_request(args.pod)
    except PodRefused:
        return None
