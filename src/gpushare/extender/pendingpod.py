"""A pod kube-scheduler is placing, as filter, prioritize, preempt and bind hand it
to the cache: read from the pod once per call (its request, the policy it names,
its priority), so the verbs pass one value instead of taking it apart themselves.
In DRA mode the request of a pod the webhook rewrote to a claim is read back from the
pod's annotation (claim_pending_pod).
"""

from dataclasses import dataclass

from gpushare.dra.ackresources import rewritten_request
from gpushare.extender.policychoice import PolicyChoice
from gpushare.objects import Pod
from gpushare.request import PodRequest, parse_pod_request


@dataclass(frozen=True, slots=True)
class PendingPod:
    key: str
    """namespace/name."""
    uid: str
    request: PodRequest
    policy: str | None
    """The placement policy the pod names; None: each node's own."""
    priority: int
    """spec.priority (nil counts as 0, as in kube-scheduler): whom preemption may evict."""


def pending_pod(pod: Pod, policies: PolicyChoice) -> PendingPod | None:
    """The pod as placement sees it; None when it asks for none of our resources.
    `policies`: what it may choose a policy among. Raises PodRefused when the pod
    breaks a rule of the resource model."""
    request = parse_pod_request(pod)
    if request is None:
        return None
    policy = policies.of_pod(pod.metadata.annotations)
    return PendingPod(pod.key, pod.metadata.uid, request, policy, pod.spec.priority or 0)


def claim_pending_pod(pod: Pod, policies: PolicyChoice) -> PendingPod | None:
    """A DRA-mode pod as placement sees it: the ACK request the webhook rewrote it from
    (dra.ackresources); None when it is not such a pod. Raises PodRefused when that
    request breaks a rule of the resource model."""
    request = rewritten_request(pod)
    if request is None:
        return None
    policy = policies.of_pod(pod.metadata.annotations)
    return PendingPod(pod.key, pod.metadata.uid, request, policy, pod.spec.priority or 0)
