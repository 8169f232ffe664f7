"""What the API server and kube-controller-manager make of an ACK pod in DRA mode,
before kube-scheduler sees it: the mutating webhook's rewrite applied as the API server
applies a JSONPatch (RFC 6902), the claim template made where missing, and the
resourceclaim controller's claim from that template, its name in the pod's status
(DRA-INTERFACES §4). The demo and the driver's test rigs take ACK pods this way; the
real-cluster tier has the real ones.
"""

import secrets
from dataclasses import dataclass

import jsonpatch

from gpushare.cluster.memory import MemoryCluster
from gpushare.dra.claims import POD_CLAIM
from gpushare.dra.objects import ObjectMeta, ResourceClaim
from gpushare.extender.draclaims import ClaimTemplates, rewrite
from gpushare.objects import Pod, PodResourceClaimStatus
from gpushare.request import PodRequest, parse_pod_request


@dataclass(frozen=True, slots=True)
class AdmittedPod:
    pod: Pod
    """As the API server stores it: rewritten, its claim's name in its status."""
    claim: ResourceClaim
    """Made from the pod's template, not allocated yet."""
    request: PodRequest
    """The ACK request the pod was created with."""


def admit_ack_pod(
    store: MemoryCluster, pod: Pod, claim_suffix: str | None = None
) -> AdmittedPod | None:
    """Creates the rewritten pod and its claim; None for a pod that asks no GPU. The
    claim is named `<pod>-gpushare-<claim_suffix>` (the controller's is random: None; ""
    leaves it off, for output that reads the same every run). Raises PodRefused for a
    pod that breaks a rule (the validating webhook refuses it)."""
    request = parse_pod_request(pod)
    if request is None:
        return None
    namespace = pod.metadata.namespace or "default"
    change = rewrite(pod, request, namespace)
    ClaimTemplates(store).ensure(change.template)
    suffix = secrets.token_hex(3)[:5] if claim_suffix is None else claim_suffix
    name = "-".join(filter(None, (pod.metadata.name, POD_CLAIM, suffix)))
    manifest = jsonpatch.apply_patch(pod.to_manifest(), change.patch)
    manifest["metadata"]["namespace"] = namespace
    created = store.create_pod(Pod.model_validate(manifest))
    template = store.get_resource_claim_template(namespace, change.template.metadata.name)
    claim = store.create_resource_claim(
        ResourceClaim(metadata=ObjectMeta(name=name, namespace=namespace), spec=template.spec.spec)
    )
    linked = store.set_pod_claim_statuses(
        namespace,
        created.metadata.name,
        [PodResourceClaimStatus(name=POD_CLAIM, resource_claim_name=name)],
    )
    return AdmittedPod(linked, claim, request)
