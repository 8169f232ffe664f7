"""The slice of Kubernetes objects gpushare reads: pods and nodes, as typed models.

Both cluster adapters and the extender's HTTP bodies parse into these, so the
rest of the code never handles raw manifests. Unknown fields are ignored.
"""

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel


def _quantities(value: Any) -> Any:
    # The API sends quantities as strings; YAML users and tests write numbers too.
    if isinstance(value, dict):
        return {k: str(v) for k, v in value.items()}
    return value


Quantities = Annotated[dict[str, str], BeforeValidator(_quantities)]


def _empty(value: object) -> bool:
    """Fields the API omits when empty (DRA's lists), left out of manifests too."""
    return not value


class K8sModel(BaseModel):
    model_config = ConfigDict(
        frozen=True, populate_by_name=True, alias_generator=to_camel, extra="ignore"
    )

    def to_manifest(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ObjectMeta(K8sModel):
    name: str
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None


class ContainerClaim(K8sModel):
    """A container's use of one of the pod's resource claims (DRA)."""

    name: str
    """The pod's claim name (`spec.resourceClaims[].name`)."""
    request: str = ""
    """One request of that claim; empty for all of them."""


class ResourceRequirements(K8sModel):
    limits: Quantities = Field(default_factory=dict)
    requests: Quantities = Field(default_factory=dict)
    claims: list[ContainerClaim] = Field(default_factory=list, exclude_if=_empty)


class EnvVar(K8sModel):
    name: str
    value: str | None = None


class Container(K8sModel):
    name: str
    image: str | None = None
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    restart_policy: str | None = None
    env: list[EnvVar] = Field(default_factory=list)


class PodResourceClaim(K8sModel):
    """A claim the pod uses: an existing ResourceClaim, or one made per pod from a
    template (its name then is in the pod's status)."""

    name: str
    resource_claim_name: str | None = None
    resource_claim_template_name: str | None = None


class PodSpec(K8sModel):
    containers: list[Container] = Field(default_factory=list)
    init_containers: list[Container] = Field(default_factory=list)
    node_name: str | None = None
    scheduler_name: str | None = None
    priority: int | None = None
    """Set by the API server from priorityClassName; nil counts as 0."""
    resource_claims: list[PodResourceClaim] = Field(default_factory=list, exclude_if=_empty)

    def container(
        self, index: int, name: str | None = None, init: bool = False
    ) -> Container | None:
        """The container at `index` of its list (init containers' with `init`); with a
        `name`, the one of that name when the index holds another (a spec edited since)."""
        group = self.init_containers if init else self.containers
        if index < len(group) and name in (None, group[index].name):
            return group[index]
        return next((c for c in group if c.name == name), None) if name is not None else None


class PodResourceClaimStatus(K8sModel):
    name: str
    resource_claim_name: str | None = None
    """The ResourceClaim made for the pod from a template; None when none was needed."""


class PodStatus(K8sModel):
    phase: str | None = None
    resource_claim_statuses: list[PodResourceClaimStatus] = Field(
        default_factory=list, exclude_if=_empty
    )


class Pod(K8sModel):
    metadata: ObjectMeta
    spec: PodSpec = Field(default_factory=PodSpec)
    status: PodStatus = Field(default_factory=PodStatus)

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"

    def claim_users(self, claim: str, request: str) -> list[str]:
        """The names of the containers (init containers first, as they start) that use
        `request` of the ResourceClaim named `claim`: those naming that request, or the
        whole claim."""
        pod_claims = {
            c.name for c in self.spec.resource_claims if c.resource_claim_name == claim
        } | {s.name for s in self.status.resource_claim_statuses if s.resource_claim_name == claim}
        return [
            c.name
            for c in (*self.spec.init_containers, *self.spec.containers)
            if any(
                use.name in pod_claims and use.request in ("", request)
                for use in c.resources.claims
            )
        ]

    @property
    def is_finished(self) -> bool:
        """Phase Succeeded or Failed: its containers have exited, so it holds no GPU."""
        return self.status.phase in ("Succeeded", "Failed")

    @property
    def is_deleting(self) -> bool:
        """Deletion asked for (deletionTimestamp set). Its containers may run on for
        the whole grace period, so it holds its GPUs until it is finished or gone,
        as kube-scheduler counts it; but no container of it will start again."""
        return self.metadata.deletion_timestamp is not None


class NodeAddress(K8sModel):
    type: str
    address: str


class NodeStatus(K8sModel):
    capacity: Quantities = Field(default_factory=dict)
    allocatable: Quantities = Field(default_factory=dict)
    addresses: list[NodeAddress] = Field(default_factory=list)


class Node(K8sModel):
    metadata: ObjectMeta
    status: NodeStatus = Field(default_factory=NodeStatus)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def internal_ip(self) -> str:
        for address in self.status.addresses:
            if address.type == "InternalIP":
                return address.address
        return ""
