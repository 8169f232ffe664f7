"""Filter, prioritize and preempt: kube-scheduler's questions, answered from the cache.

Each function takes the parsed request and returns the encoded answer in the
exact shape of the extender API (docs/contracts.md#extender-json). The pod is read
once per call (`cache.pending`: its request, policy and priority) and handed to
the cache as that one value. Pods that ask for none of our resources pass
straight through; pods that break a rule are refused on every node with the rule,
as unresolvable, since no node and no amount of waiting can help.
"""

from typing import Any

from gpushare.errors import PodRefused
from gpushare.extender.argsreader import ExtenderArgsReader
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.metrics import ExtenderMetrics
from gpushare.extender.pendingpod import PendingPod
from gpushare.extender.wire import ExtenderArgs, PreemptionArgs, dumps, for_scheduler


def filter_nodes(
    cache: SchedulerCache,
    metrics: ExtenderMetrics,
    args: ExtenderArgs,
    reader: ExtenderArgsReader,
) -> bytes:
    """`reader` (the one that read `args`) is told which list prioritize will bring: the
    nodes that passed (prioritize's answer is then made from filter's, see
    `AnswerTable.priorities_json`)."""
    names = args.candidates()
    try:
        pending = cache.pending(args.pod)
    except PodRefused as refused:
        for refusal in refused.refusals:
            metrics.filter_rejections.labels(refusal.rule.value).inc(len(names))
        reason = for_scheduler(str(refused))
        reasons = dumps(dict.fromkeys(names, reason)).decode()
        return _answer_without_table(args, [], reasons)
    if pending is None:
        return _answer_without_table(args, names, "{}")
    answers = cache.filter(pending, names)
    for rule, count in answers.rules().items():
        metrics.filter_rejections.labels(rule).inc(count)
    failed, unresolvable = answers.failed_json(), answers.unresolvable_json()
    if args.node_names is not None:
        passed = answers.passed_json()
        if not answers.fits_nowhere():
            reader.expect(answers.passed_names(), passed)
        return _filter_answer("null", passed, failed, unresolvable)
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
    pending = _pending_or_none(cache, args)
    if pending is None:
        return dumps([{"Host": name, "Score": 0} for name in names])
    return cache.priorities_json(pending, names).encode()


def prioritize_claims(cache: SchedulerCache, args: ExtenderArgs) -> bytes:
    """DRA mode's scores: the second extender entry, which has no managedResources, so
    kube-scheduler asks it for every pod of our scheduler. A pod the webhook rewrote to
    a claim is scored as its ACK request would be; every other pod scores 0 on every
    node (the first entry scores those that ask aliyun.com resources)."""
    names = args.candidates()
    try:
        pending = cache.claim_pending(args.pod)
    except PodRefused:
        pending = None
    if pending is None:
        return dumps([{"Host": name, "Score": 0} for name in names])
    return cache.claim_priorities_json(pending, names).encode()


def preempt_nodes(cache: SchedulerCache, args: PreemptionArgs) -> bytes:
    """Per candidate node, the victims that make room for the pod by our rules.

    kube-scheduler chose its victims by the node's sum of each resource; on each node
    we answer the cheapest set of lower-priority GPU pods whose eviction makes the pod
    fit (gpushare.placement.preemption), or the scheduler's own set when it already makes room
    and is no dearer, or when the pod fits without evicting any GPU pod (then what is
    short is something only the scheduler sees). A node where nothing helps is
    dropped, and so is one left without victims (the scheduler counts an empty list
    as an error). Pods being deleted count as gone and are never picked.

    NumPDBViolations is passed on as the scheduler gave it, for our set too: only the
    scheduler sees PodDisruptionBudgets, and its count for its own set on that node is
    the best estimate we have (0 would make every replaced set look free of them).
    """
    candidates = args.victims()
    kept: dict[str, Any] = {}
    try:
        pending = cache.pending(args.pod)
    except PodRefused:
        return dumps({"NodeNameToMetaVictims": kept})  # fits nowhere, whoever is evicted
    for node, (uids, violations) in candidates.items():
        if pending is not None:
            uids = cache.victims(node, pending, uids)
        if uids:
            victims = [{"UID": uid} for uid in uids]
            kept[node] = {"Pods": victims, "NumPDBViolations": violations}
    return dumps({"NodeNameToMetaVictims": kept})


def _pending_or_none(cache: SchedulerCache, args: ExtenderArgs) -> PendingPod | None:
    try:
        return cache.pending(args.pod)
    except PodRefused:
        return None
