"""An ACK pod as DRA mode's webhook leaves it: its patch applied as the API server
applies one (RFC 6902, jsonpatch)."""

import jsonpatch

from gpushare.extender.draclaims import rewrite
from gpushare.objects import Pod
from gpushare.request import parse_pod_request


def rewritten(pod: Pod) -> Pod:
    """The pod after the webhook's rewrite to a claim (it must ask aliyun.com resources)."""
    request = parse_pod_request(pod)
    assert request is not None, "only a pod that asks aliyun.com resources is rewritten"
    change = rewrite(pod, request, pod.metadata.namespace or "default")
    return Pod.model_validate(jsonpatch.apply_patch(pod.to_manifest(), change.patch))
