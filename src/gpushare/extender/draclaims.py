"""DRA mode's half of the mutating webhook: an ACK pod rewritten to ask for a claim
(docs/dra.md#acks-pods-unchanged).

`aliyun.com/gpu-mem: 4` means 4 GiB of one GPU; KEP-5004's extended-resource mapping
would allocate four devices for it (DRA-INTERFACES §7). So the webhook takes the
`aliyun.com/*` quantities out of the pod's containers and gives the pod one claim,
made per pod by the claim controller from a template named for its content
(`dra.claims.template_name`), with one request per GPU container that asks the GPU's
memory (and compute share) as device capacity. The template is created in the pod's
namespace when first needed, before the pod is admitted (not on a dry run).
"""

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpushare.cluster import ClusterError, Conflict, DraCluster
from gpushare.dra.ackresources import ACK_RESOURCES, ack_resources
from gpushare.dra.claims import POD_CLAIM, claim_requests, template_name, template_spec
from gpushare.dra.objects import ObjectMeta, ResourceClaimTemplate, ResourceClaimTemplateSpec
from gpushare.memo import BoundedMemo
from gpushare.objects import Container, Pod
from gpushare.request import ContainerRole, PodRequest
from gpushare.resources import MANAGED_RESOURCES

log = logging.getLogger(__name__)

TEMPLATE_ANNOTATION: Final = "gpushare.io/claim-template"
"""On a rewritten pod: the template its claim comes from (`kubectl inspect cgpu`)."""
KNOWN_TEMPLATES: Final = 4096


@dataclass(frozen=True, slots=True)
class ClaimRewrite:
    patch: list[dict[str, Any]]
    template: ResourceClaimTemplate


class PodClaimConflict(ValueError):
    """The pod already has a claim of the name the rewrite would give it."""


def rewrite(pod: Pod, request: PodRequest, namespace: str) -> ClaimRewrite:
    """The JSONPatch that turns the pod's ACK request into its claim, and the template
    that claim comes from. Raises PodClaimConflict."""
    if any(c.name == POD_CLAIM for c in pod.spec.resource_claims):
        raise PodClaimConflict(
            f"the pod already has a resource claim named {POD_CLAIM!r}: rename it, or ask "
            "for the GPU by that claim instead of aliyun.com resources"
        )
    requests = claim_requests(request)
    name = template_name(requests)
    template = ResourceClaimTemplate(
        metadata=ObjectMeta(name=name, namespace=namespace),
        spec=ResourceClaimTemplateSpec.model_validate(template_spec(requests)),
    )
    patch: list[dict[str, Any]] = []
    taken: list[Container] = []
    for wanted in request.containers:
        group = "containers" if wanted.role is ContainerRole.APP else "initContainers"
        container = pod.spec.container(wanted.index, wanted.name, group == "initContainers")
        assert container is not None  # parse_pod_request found it there
        patch += _container_patch(f"/spec/{group}/{wanted.index}", container, wanted.name)
        taken.append(container)
    claim = {"name": POD_CLAIM, "resourceClaimTemplateName": name}
    if pod.spec.resource_claims:
        patch.append({"op": "add", "path": "/spec/resourceClaims/-", "value": claim})
    else:
        patch.append({"op": "add", "path": "/spec/resourceClaims", "value": [claim]})
    patch += _annotations(
        pod.metadata.annotations, {TEMPLATE_ANNOTATION: name, ACK_RESOURCES: ack_resources(taken)}
    )
    return ClaimRewrite(patch, template)


def _container_patch(path: str, container: Container, request: str) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    resources = container.resources
    for kind, quantities in (("limits", resources.limits), ("requests", resources.requests)):
        ops += [
            {"op": "remove", "path": f"{path}/resources/{kind}/{_escape(name)}"}
            for name in MANAGED_RESOURCES
            if name in quantities
        ]
    use = {"name": POD_CLAIM, "request": request}
    if resources.claims:
        ops.append({"op": "add", "path": f"{path}/resources/claims/-", "value": use})
    else:
        ops.append({"op": "add", "path": f"{path}/resources/claims", "value": [use]})
    return ops


def _annotations(current: Mapping[str, str], added: dict[str, str]) -> list[dict[str, Any]]:
    if not current:
        return [{"op": "add", "path": "/metadata/annotations", "value": added}]
    return [
        {"op": "add", "path": f"/metadata/annotations/{_escape(key)}", "value": value}
        for key, value in added.items()
    ]


def _escape(name: str) -> str:
    """A JSON Pointer reference token (RFC 6901): ~ and / escaped."""
    return name.replace("~", "~0").replace("/", "~1")


class ClaimTemplates:
    """Creates the templates pods are rewritten to, once per namespace and name."""

    def __init__(self, dra: DraCluster) -> None:
        self._dra = dra
        self._known: BoundedMemo[tuple[str, str], bool] = BoundedMemo(KNOWN_TEMPLATES)
        self._lock = threading.Lock()

    def ensure(self, template: ResourceClaimTemplate) -> None:
        """Raises ClusterError when the template neither exists nor can be made."""
        key = (template.metadata.namespace or "", template.metadata.name)
        with self._lock:
            if self._known.get(key):
                return
        try:
            self._dra.create_resource_claim_template(template)
            log.info("created ResourceClaimTemplate %s/%s", *key)
        except Conflict:
            pass  # made by an earlier pod (or another replica): same name, same content
        except ClusterError:
            raise
        with self._lock:
            self._known.put(key, True)
