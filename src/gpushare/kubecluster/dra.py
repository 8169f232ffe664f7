"""The DRA half of the Kubernetes-API adapter: the resource.k8s.io/v1 objects through
the official client (DRA-INTERFACES §4, §8).

The models of gpushare.dra.objects are the boundary. Answers are decoded once from the
API's JSON into them (`_preload_content=False`), never through the client's generated
models. Writes send their JSON as it is, through the client's ApiClient (its auth, TLS
and connection pool) rather than ResourceV1Api's typed methods: those validate the body
into the client's models, which forbid fields they do not know, so a field newer than
the client, read from the server, could not be written back.
"""

from typing import Any, Final, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpushare.dra.objects import (
    DeviceClass,
    ObjectMeta,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)
from gpushare.kubecluster.apicall import decoded, discard, perform, read_json

_Object = TypeVar("_Object", ResourceSlice, ResourceClaim, ResourceClaimTemplate, DeviceClass)

API: Final = "/apis/resource.k8s.io/v1"
_JSON: Final = {"Accept": "application/json", "Content-Type": "application/json"}


class KubeDra:
    """Implements gpushare.cluster.DraCluster; KubeCluster inherits it."""

    def __init__(self, api: client.ApiClient) -> None:
        self.resource = client.ResourceV1Api(api)

    # ----- ResourceSlice

    def get_resource_slice(self, name: str) -> ResourceSlice:
        return _one(
            ResourceSlice, f"get resourceslice {name}", self.resource.read_resource_slice, name
        )

    def list_resource_slices(
        self, driver: str | None = None, node_name: str | None = None
    ) -> list[ResourceSlice]:
        return _items(
            ResourceSlice,
            "list resourceslices",
            self.resource.list_resource_slice,
            **_fields(("spec.driver", driver), ("spec.nodeName", node_name)),
        )

    def create_resource_slice(self, resource_slice: ResourceSlice) -> ResourceSlice:
        return self._write(
            f"create resourceslice {_named(resource_slice.metadata)}",
            "POST",
            f"{API}/resourceslices",
            resource_slice,
        )

    def update_resource_slice(self, resource_slice: ResourceSlice) -> ResourceSlice:
        name = resource_slice.metadata.name
        return self._write(
            f"update resourceslice {name}",
            "PUT",
            f"{API}/resourceslices/{{name}}",
            resource_slice,
            name=name,
        )

    def delete_resource_slice(self, name: str) -> None:
        _done(f"delete resourceslice {name}", self.resource.delete_resource_slice, name)

    def delete_resource_slices(self, node_name: str, driver: str | None = None) -> None:
        _done(
            f"delete the resourceslices of node {node_name}",
            self.resource.delete_collection_resource_slice,
            **_fields(("spec.nodeName", node_name), ("spec.driver", driver)),
        )

    # ----- ResourceClaim

    def get_resource_claim(self, namespace: str, name: str) -> ResourceClaim:
        return _one(
            ResourceClaim,
            f"get resourceclaim {namespace}/{name}",
            self.resource.read_namespaced_resource_claim,
            name,
            namespace,
        )

    def list_resource_claims(self, namespace: str | None = None) -> list[ResourceClaim]:
        if namespace is None:
            return _items(
                ResourceClaim,
                "list resourceclaims",
                self.resource.list_resource_claim_for_all_namespaces,
            )
        return _items(
            ResourceClaim,
            f"list resourceclaims in {namespace}",
            self.resource.list_namespaced_resource_claim,
            namespace,
        )

    def create_resource_claim(self, claim: ResourceClaim) -> ResourceClaim:
        namespace = claim.metadata.namespace or "default"
        return self._write(
            f"create resourceclaim {namespace}/{_named(claim.metadata)}",
            "POST",
            f"{API}/namespaces/{{namespace}}/resourceclaims",
            claim,
            namespace=namespace,
        )

    def update_resource_claim(self, claim: ResourceClaim) -> ResourceClaim:
        return self._replace_claim(claim, "")

    def update_resource_claim_status(self, claim: ResourceClaim) -> ResourceClaim:
        return self._replace_claim(claim, "/status")

    def _replace_claim(self, claim: ResourceClaim, subresource: str) -> ResourceClaim:
        meta = claim.metadata
        return self._write(
            f"update resourceclaim {meta.namespace}/{meta.name}{subresource}",
            "PUT",
            f"{API}/namespaces/{{namespace}}/resourceclaims/{{name}}{subresource}",
            claim,
            namespace=meta.namespace or "",
            name=meta.name,
        )

    def delete_resource_claim(self, namespace: str, name: str) -> None:
        _done(
            f"delete resourceclaim {namespace}/{name}",
            self.resource.delete_namespaced_resource_claim,
            name,
            namespace,
        )

    # ----- ResourceClaimTemplate, DeviceClass

    def get_resource_claim_template(self, namespace: str, name: str) -> ResourceClaimTemplate:
        return _one(
            ResourceClaimTemplate,
            f"get resourceclaimtemplate {namespace}/{name}",
            self.resource.read_namespaced_resource_claim_template,
            name,
            namespace,
        )

    def create_resource_claim_template(
        self, template: ResourceClaimTemplate
    ) -> ResourceClaimTemplate:
        namespace = template.metadata.namespace or "default"
        return self._write(
            f"create resourceclaimtemplate {namespace}/{_named(template.metadata)}",
            "POST",
            f"{API}/namespaces/{{namespace}}/resourceclaimtemplates",
            template,
            namespace=namespace,
        )

    def list_device_classes(self) -> list[DeviceClass]:
        return _items(DeviceClass, "list deviceclasses", self.resource.list_device_class)

    def create_device_class(self, device_class: DeviceClass) -> DeviceClass:
        return self._write(
            f"create deviceclass {_named(device_class.metadata)}",
            "POST",
            f"{API}/deviceclasses",
            device_class,
        )

    # ----- helpers

    def _write(self, what: str, method: str, path: str, obj: _Object, **names: str) -> _Object:
        """Sends `obj`'s JSON to `path` (its {placeholders} filled from `names`, quoted);
        the answer is the object as stored."""
        api = self.resource.api_client

        def call() -> Any:
            request = api.param_serialize(
                method=method,
                resource_path=path,
                path_params=names,
                header_params=dict(_JSON),
                body=obj.to_api(),
                auth_settings=["BearerToken"],
            )
            response = api.call_api(*request)
            response.read()
            if not 200 <= response.status <= 299:
                raise ApiException.from_response(http_resp=response, body=None, data=None)
            return response

        return decoded(type(obj), read_json(what, perform(what, call)))


def _one(kind: type[_Object], what: str, call: Any, *args: Any) -> _Object:
    response = perform(what, call, *args, _preload_content=False)
    return decoded(kind, read_json(what, response))


def _items(kind: type[_Object], what: str, call: Any, *args: Any, **kwargs: Any) -> list[_Object]:
    response = perform(what, call, *args, _preload_content=False, **kwargs)
    return [decoded(kind, item) for item in read_json(what, response).get("items") or ()]


def _done(what: str, call: Any, *args: Any, **kwargs: Any) -> None:
    discard(perform(what, call, *args, _preload_content=False, **kwargs))


def _fields(*selected: tuple[str, str | None]) -> dict[str, str]:
    """A field selector of the fields given a value; none when none is."""
    selector = ",".join(f"{path}={value}" for path, value in selected if value)
    return {"field_selector": selector} if selector else {}


def _named(meta: ObjectMeta) -> str:
    """The object's name, or what the server will name it after."""
    return meta.name or f"{meta.generate_name or ''}*"
