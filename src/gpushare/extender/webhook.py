"""Admission webhook (AdmissionReview admission.k8s.io/v1) for pods.

validate: refuses a pod that breaks a rule of the resource model, or asks for more
than any node of the modes that can take it has (a larger GPU, more GPUs: it runs in
the extender's process and asks its cache), with every rule it breaks in the message,
so `kubectl apply` fails at once instead of the pod waiting Pending forever; and warns
(admitting it) about a pod that asks for our resources under a scheduler name that
neither we nor the default scheduler serve, which nothing may ever schedule, or when
no node of a mode that can take it exists yet. mutate: sends pods that ask for our
resources and kept the default scheduler to ours (a JSONPatch on
spec.schedulerName); in DRA mode also rewrites them to a resource claim
(draclaims.py), which our scheduler's kube-scheduler allocates with our node scores.
"""

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from gpushare.cluster import ClusterError
from gpushare.errors import PodRefused, Refusal, Rule
from gpushare.extender.draclaims import ClaimTemplates, PodClaimConflict, rewrite
from gpushare.extender.mirror import GpuShape
from gpushare.extender.policychoice import PolicyChoice
from gpushare.extender.schedulernames import DEFAULT_SCHEDULER, unserved_scheduler, unserved_warning
from gpushare.extender.wire import AdmissionReview, WireError, describe
from gpushare.labels import LABEL_SCHEDULE, NodeMode
from gpushare.objects import Pod
from gpushare.request import PodRequest, parse_pod_request, requests_gpu


def validate(
    review: AdmissionReview,
    served: Sequence[str],
    policies: PolicyChoice,
    shapes: Mapping[NodeMode, GpuShape] | None = None,
) -> dict[str, Any]:
    """`served`: every schedulerName our scheduler serves; `policies`: the placement
    policies the extender knows; `shapes`: what the nodes of each mode
    offer at most (None while the extender has not listed them: nothing is refused or
    warned about for want of a node then)."""
    pod = _pod(review)
    if pod is None:
        return _answer(review, allowed=True)
    unserved = unserved_scheduler(pod, served)
    warnings = [unserved_warning(unserved, served)] if unserved else []
    refusals: list[Refusal] = []
    try:
        request = parse_pod_request(pod)
    except PodRefused as refused:
        refusals.extend(refused.refusals)
        request = None
    if request is not None and shapes is not None:
        refusals.extend(_beyond_every_node(request, shapes, warnings))
    policy = policies.refusal(pod.metadata.annotations)
    if policy is not None:
        refusals.append(policy)
    extra: dict[str, Any] = {"warnings": warnings} if warnings else {}
    if not refusals:
        return _answer(review, allowed=True, **extra)
    message = f"gpushare refused pod {_name(review, pod)}: " + "; ".join(map(str, refusals))
    return _answer(
        review,
        allowed=False,
        status={"code": 403, "reason": "Forbidden", "message": message},
        **extra,
    )


def _beyond_every_node(
    request: PodRequest, shapes: Mapping[NodeMode, GpuShape], warnings: list[str]
) -> list[Refusal]:
    """What no node of a mode that can take the pod could ever give it; a warning
    instead when there is no such node yet."""
    modes = [NodeMode.CORE_MEM] if request.uses_core else list(NodeMode)
    named = " or ".join(modes)
    known = [shapes[mode] for mode in modes if mode in shapes]
    if not known:
        warnings.append(
            f"no node in mode {named} is known yet: the pod stays Pending until a GPU node "
            f"is labelled {LABEL_SCHEDULE}={modes[0]} and its gpushare device plugin runs"
        )
        return []
    most = GpuShape(0, 0)
    for shape in known:
        most = most.widened(shape)
    refusals = []
    for c in request.containers:
        wants = f"container {c.name!r} asks for {c.describe()}"
        if c.gpus > most.most_gpus:
            refusals.append(
                Refusal(
                    Rule.MORE_GPUS_THAN_ANY_NODE,
                    f"{wants}; no node in mode {named} has more than {most.most_gpus} GPUs",
                )
            )
        elif c.mem > most.largest_gpu:
            refusals.append(
                Refusal(
                    Rule.LARGER_THAN_ANY_GPU,
                    f"{wants}; the largest GPU of any node in mode {named} has "
                    f"{most.largest_gpu} GiB",
                )
            )
    return refusals


def mutate(
    review: AdmissionReview, scheduler_name: str, templates: ClaimTemplates | None = None
) -> dict[str, Any]:
    """`templates`: in DRA mode (--dra-claims), the pod is rewritten to a claim instead
    (draclaims.py) and its claim template made where it is missing."""
    pod = _pod(review)
    if pod is None or not requests_gpu(pod) or review.request.operation not in ("", "CREATE"):
        # schedulerName cannot change once the pod exists: only a new pod is sent to us.
        return _answer(review, allowed=True)
    if templates is not None:
        return _to_claim(review, pod, templates, _scheduler_patch(pod, scheduler_name))
    patch = _scheduler_patch(pod, scheduler_name)
    if not patch:
        return _answer(review, allowed=True)
    return _patched(review, patch)


def _scheduler_patch(pod: Pod, scheduler_name: str) -> list[dict[str, Any]]:
    if (pod.spec.scheduler_name or DEFAULT_SCHEDULER) != DEFAULT_SCHEDULER:
        return []  # the user chose a scheduler: theirs to keep
    return [{"op": "add", "path": "/spec/schedulerName", "value": scheduler_name}]


def _patched(review: AdmissionReview, patch: list[dict[str, Any]]) -> dict[str, Any]:
    return _answer(
        review,
        allowed=True,
        patchType="JSONPatch",
        patch=base64.b64encode(json.dumps(patch).encode()).decode(),
    )


def _to_claim(
    review: AdmissionReview, pod: Pod, templates: ClaimTemplates, scheduler: list[dict[str, Any]]
) -> dict[str, Any]:
    """`scheduler`: the patch that sends the pod to our scheduler, whose kube-scheduler
    allocates the claim and asks our extender to score its nodes
    (docs/dra.md#node-scores-in-dra-mode)."""
    try:
        request = parse_pod_request(pod)
    except PodRefused:
        # Left as it is: the validating webhook refuses it, naming every rule it breaks.
        return _answer(review, allowed=True)
    if request is None:
        return _answer(review, allowed=True)
    namespace = review.request.namespace or pod.metadata.namespace or "default"
    try:
        change = rewrite(pod, request, namespace)
        if not review.request.dry_run:
            templates.ensure(change.template)
    except (PodClaimConflict, ClusterError) as err:
        message = f"gpushare cannot give pod {_name(review, pod)} its GPU claim: {err}"
        return _answer(
            review, allowed=False, status={"code": 403, "reason": "Forbidden", "message": message}
        )
    return _patched(review, change.patch + scheduler)


def _pod(review: AdmissionReview) -> Pod | None:
    """The reviewed Pod, None for other kinds and for DELETE (no object)."""
    request = review.request
    if request.kind.get("kind", "Pod") != "Pod" or request.object is None:
        return None
    obj = request.object
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "name" not in metadata:
        # Pods of a Deployment or Job have only generateName when they are created.
        obj = {**obj, "metadata": {**metadata, "name": ""}}
    try:
        return Pod.model_validate(obj)
    except ValidationError as err:
        raise WireError(f"request.object: {describe(err)}") from None


def _name(review: AdmissionReview, pod: Pod) -> str:
    name = pod.metadata.name
    if not name:  # a workload's pod: its name is generated after admission
        metadata = (review.request.object or {}).get("metadata") or {}
        name = f"{metadata.get('generateName') or ''}<generated>"
    return f"{review.request.namespace or pod.metadata.namespace or 'default'}/{name}"


def _answer(review: AdmissionReview, allowed: bool, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": review.api_version,
        "kind": "AdmissionReview",
        "response": {"uid": review.request.uid, "allowed": allowed, **extra},
    }
