"""The ACK request a pod was rewritten from, kept on the pod for the extender's node
scores (docs/dra.md#node-scores-in-dra-mode).

The webhook takes the `aliyun.com/*` quantities out of a DRA-mode pod's containers
(extender.draclaims) and writes them into one annotation; the extender scores nodes
for the pod from them and charges what the allocator gave it until the driver writes
the allocation record. A pod's annotations are its author's to write, so the request
read back is trusted only as far as the claim the pod really has: it must be the
pod's `gpushare` claim from the template that request makes (templates are named for
their content). A pod whose annotation says more than its claim asks gets no scores
and no charge; what its claim holds reaches the books when the driver prepares it.
"""

import json
from typing import Final

from gpushare.dra.claims import POD_CLAIM, claim_requests, template_name
from gpushare.objects import Container, Pod
from gpushare.request import PodRequest, parse_pod_request
from gpushare.resources import MANAGED_RESOURCES

ACK_RESOURCES: Final = "gpushare.io/ack-resources"
"""On a rewritten pod: the aliyun.com quantities taken out of each container, as JSON
`{"<container>": {"aliyun.com/gpu-mem": "4"}}`."""
MAX_ANNOTATION: Final = 16 * 1024
"""The most of the annotation read: a pod of many GPU containers needs a few KiB."""


def ack_resources(containers: list[Container]) -> str:
    """The annotation's value for the containers the rewrite takes the quantities out of."""
    taken = {}
    for container in containers:
        resources = container.resources
        quantities = {**resources.requests, **resources.limits}
        ours = {name: quantities[name] for name in MANAGED_RESOURCES if name in quantities}
        if ours:
            taken[container.name] = ours
    return json.dumps(taken, sort_keys=True, separators=(",", ":"))


def rewritten_request(pod: Pod) -> PodRequest | None:
    """The ACK request the pod was rewritten from, when its claim is the one that request
    makes; None otherwise (no annotation, an unreadable one, another claim, or a pod
    that also asks aliyun.com resources itself). Raises PodRefused when the request
    breaks a rule of the resource model."""
    text = pod.metadata.annotations.get(ACK_RESOURCES)
    if text is None or len(text) > MAX_ANNOTATION:
        return None
    taken = _decode(text)
    if taken is None or parse_pod_request(pod) is not None:
        return None
    template = next(
        (c.resource_claim_template_name for c in pod.spec.resource_claims if c.name == POD_CLAIM),
        None,
    )
    if template is None:
        return None
    request = parse_pod_request(_restored(pod, taken))
    if request is None or template_name(claim_requests(request)) != template:
        return None
    return request


def _decode(text: str) -> dict[str, dict[str, str]] | None:
    try:
        taken = json.loads(text)
    except ValueError:
        return None
    if not isinstance(taken, dict):
        return None
    for quantities in taken.values():
        if not isinstance(quantities, dict) or not all(
            name in MANAGED_RESOURCES and isinstance(value, str)
            for name, value in quantities.items()
        ):
            return None
    return taken


def _restored(pod: Pod, taken: dict[str, dict[str, str]]) -> Pod:
    """The pod with each container's quantities given back, as it was created."""

    def restore(containers: list[Container]) -> list[Container]:
        return [
            c.model_copy(
                update={
                    "resources": c.resources.model_copy(
                        update={"limits": {**c.resources.limits, **taken[c.name]}}
                    )
                }
            )
            if c.name in taken
            else c
            for c in containers
        ]

    spec = pod.spec.model_copy(
        update={
            "containers": restore(pod.spec.containers),
            "init_containers": restore(pod.spec.init_containers),
        }
    )
    return pod.model_copy(update={"spec": spec})
