"""The resource.k8s.io/v1 routes of the test API server (apiserver.py), over a
MemoryCluster: reads, lists with the spec.driver / spec.nodeName field selectors,
creates, replaces (PUT, and PUT of a claim's /status), deletes, a delete of the
collection of one node's slices; failures as the API server's Status JSON: 404
NotFound, 409 Conflict / AlreadyExists, 422 Invalid with details.causes naming the
fields, 400 for a body that is not the object or a selector it does not serve."""

import re
from typing import Any

from pydantic import ValidationError

from gpushare.cluster import Conflict, Invalid, NotFound
from gpushare.cluster.memory import MemoryCluster
from gpushare.dra.objects import (
    API_VERSION,
    DeviceClass,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)

PREFIX = ["apis", "resource.k8s.io", "v1"]
SELECTABLE = {"spec.driver": "driver", "spec.nodeName": "node_name"}

Answer = tuple[int, dict[str, Any]]


def status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def serve(cluster: MemoryCluster, method: str, rest: list[str], query, body: Any) -> Answer:
    """(HTTP status, JSON body) of one request to /apis/resource.k8s.io/v1/<rest>."""
    try:
        return _route(cluster, method, rest, query, body)
    except NotFound as err:
        return 404, status(404, "NotFound", str(err))
    except Invalid as err:
        return 422, _invalid(err)
    except Conflict as err:
        reason = "AlreadyExists" if "already exists" in str(err) else "Conflict"
        return 409, status(409, reason, str(err))
    except (ValidationError, _BadRequest) as err:
        return 400, status(400, "BadRequest", str(err))


class _BadRequest(Exception):
    pass


def _route(cluster: MemoryCluster, method: str, rest: list[str], query, body: Any) -> Answer:
    match method, rest:
        case "GET", ["resourceslices"]:
            return _list("ResourceSliceList", cluster.list_resource_slices(**_selected(query)))
        case "POST", ["resourceslices"]:
            return 201, cluster.create_resource_slice(_read(ResourceSlice, body)).to_api()
        case "DELETE", ["resourceslices"]:
            chosen = _selected(query)
            if "node_name" not in chosen:
                raise _BadRequest("this stand-in deletes the slices of one node only")
            doomed = cluster.list_resource_slices(**chosen)
            cluster.delete_resource_slices(**chosen)
            return _list("ResourceSliceList", doomed)
        case "GET", ["resourceslices", name]:
            return 200, cluster.get_resource_slice(name).to_api()
        case "PUT", ["resourceslices", name]:
            return 200, cluster.update_resource_slice(_read(ResourceSlice, body, name)).to_api()
        case "DELETE", ["resourceslices", name]:
            gone = cluster.get_resource_slice(name)
            cluster.delete_resource_slice(name)
            return 200, gone.to_api()
        case "GET", ["resourceclaims"]:
            return _list("ResourceClaimList", cluster.list_resource_claims())
        case "GET", ["namespaces", namespace, "resourceclaims"]:
            return _list("ResourceClaimList", cluster.list_resource_claims(namespace))
        case "POST", ["namespaces", namespace, "resourceclaims"]:
            claim = _read(ResourceClaim, body, namespace=namespace)
            return 201, cluster.create_resource_claim(claim).to_api()
        case "GET", ["namespaces", namespace, "resourceclaims", name]:
            return 200, cluster.get_resource_claim(namespace, name).to_api()
        case "PUT", ["namespaces", namespace, "resourceclaims", name, *sub] if sub in (
            [],
            ["status"],
        ):
            claim = _read(ResourceClaim, body, name, namespace)
            update = cluster.update_resource_claim_status if sub else cluster.update_resource_claim
            return 200, update(claim).to_api()
        case "DELETE", ["namespaces", namespace, "resourceclaims", name]:
            gone_claim = cluster.get_resource_claim(namespace, name)
            cluster.delete_resource_claim(namespace, name)
            return 200, gone_claim.to_api()
        case "POST", ["namespaces", namespace, "resourceclaimtemplates"]:
            template = _read(ResourceClaimTemplate, body, namespace=namespace)
            return 201, cluster.create_resource_claim_template(template).to_api()
        case "GET", ["namespaces", namespace, "resourceclaimtemplates", name]:
            return 200, cluster.get_resource_claim_template(namespace, name).to_api()
        case "GET", ["deviceclasses"]:
            return _list("DeviceClassList", cluster.list_device_classes())
        case "POST", ["deviceclasses"]:
            return 201, cluster.create_device_class(_read(DeviceClass, body)).to_api()
    path = "/".join(rest)
    return 405, status(405, "MethodNotAllowed", f"{method} {'/'.join(PREFIX)}/{path}")


def _read(kind: type[Any], body: Any, name: str = "", namespace: str = "") -> Any:
    """The body as the object the URL names: the API server refuses another name, and
    takes the namespace from the URL."""
    obj = kind.model_validate(body)
    if name and obj.metadata.name != name:
        raise _BadRequest(f"the name of the object ({obj.metadata.name}) does not match the URL")
    if namespace:
        meta = obj.metadata.model_copy(update={"namespace": namespace})
        obj = obj.model_copy(update={"metadata": meta})
    return obj


def _selected(query: dict[str, list[str]]) -> dict[str, str]:
    chosen = {}
    for term in filter(None, (query.get("fieldSelector") or [""])[0].split(",")):
        field, _, value = term.partition("=")
        if field not in SELECTABLE:
            raise _BadRequest(f'field label not supported: "{field}"')
        chosen[SELECTABLE[field]] = value
    return chosen


def _list(kind: str, items: list[Any]) -> Answer:
    return 200, {
        "kind": kind,
        "apiVersion": API_VERSION,
        "metadata": {"resourceVersion": ""},
        "items": [item.to_api() for item in items],
    }


_SUBJECT = re.compile(r'(?P<kind>\S+) "(?P<name>[^"]*)"')


def _invalid(err: Invalid) -> dict[str, Any]:
    """A 422 as the API server writes one: the object's kind and name, one cause per field."""
    subject = _SUBJECT.match(str(err))
    assert subject is not None, str(err)
    causes = [
        {"reason": "FieldValueInvalid", "message": e.message, "field": e.path} for e in err.errors
    ]
    return status(
        422,
        "Invalid",
        str(err).replace(subject["kind"], f"{subject['kind']}.resource.k8s.io", 1),
        name=subject["name"],
        group="resource.k8s.io",
        kind=subject["kind"],
        causes=causes,
    )
