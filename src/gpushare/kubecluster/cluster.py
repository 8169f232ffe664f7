"""The Kubernetes-API adapter of the cluster port, on the official `kubernetes` client.

API objects are converted to gpushare's typed `Pod` and `Node` through the
client's own serialisation (camelCase JSON, as the API server sends it), and
API errors become the port's errors: 404 NotFound, 409 Conflict or AlreadyBound,
410 Expired, anything else ClusterError with the server's message.
"""

import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException
from kubernetes.watch import Watch as ClientWatch
from pydantic import ValidationError

from gpushare.cluster import (
    AlreadyBound,
    ClusterError,
    Conflict,
    EventSeverity,
    EventType,
    Expired,
    Listing,
    NotFound,
    ObjectRef,
    WatchEvent,
)
from gpushare.objects import Node, Pod

log = logging.getLogger(__name__)

_T = TypeVar("_T", Node, Pod)

MERGE_PATCH = "application/merge-patch+json"
WATCH_TIMEOUT_S = 300
"""The server ends each watch after this long; the cache then resumes from the
last resourceVersion it saw (what client-go does with its random 5-10 min)."""

EVENT_SOURCE = "gpushare"

KUBECONFIG_ENV = "KUBECONFIG"
HOME_KUBECONFIG = "~/.kube/config"
IN_CLUSTER = "the in-cluster service account"

_ASSIGNED = re.compile(r'is already assigned to node "([^"]*)"')


class _RawWatch(ClientWatch):
    """The client's watch without its model decoding: each event stays the API's JSON,
    decoded once, into the core's models (not client model, then dict, then ours)."""

    def get_return_type(self, func: Any) -> None:
        return None


class KubeWatch(Iterator[WatchEvent[_T]]):
    """One watch request, with bookmarks: iterates events until the server ends the
    stream or stop(). `resume_from` is the version the next watch starts at: the latest
    event's or bookmark's, so a quiet collection does not fall out of the server's
    window and cost a full list (410 Gone)."""

    def __init__(
        self, kind: type[_T], list_call: Any, api: client.ApiClient, **kwargs: Any
    ) -> None:
        self._kind = kind
        self._api = api
        self._watch = _RawWatch()
        self._events = self._watch.stream(list_call, allow_watch_bookmarks=True, **kwargs)
        self.resume_from = ""

    def __iter__(self) -> "KubeWatch[_T]":
        return self

    def __next__(self) -> WatchEvent[_T]:
        while True:
            try:
                raw = next(self._events)
            except StopIteration:
                raise  # the server ended the stream: the caller resumes from its version
            except ApiException as err:
                raise _translate(err, "watch") from err
            except Exception as err:  # the connection dropped mid-stream
                raise ClusterError(f"watch stream failed: {err}") from err
            kind = raw.get("type")
            version = ((raw.get("object") or {}).get("metadata") or {}).get("resourceVersion")
            if version:
                self.resume_from = version
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                return WatchEvent(EventType(kind), _convert(self._kind, raw["object"]))
            # BOOKMARK and anything newer: only its version matters; keep reading.

    def stop(self) -> None:
        self._watch.stop()


class KubeCluster:
    """Implements gpushare.cluster.Cluster against a Kubernetes API server."""

    def __init__(
        self,
        api: client.ApiClient,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        origin: str = "",
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.watch_timeout_s = watch_timeout_s
        self.origin = origin
        """Where the configuration came from, for the start-up log line."""

    @classmethod
    def from_config(
        cls, kubeconfig: str | None = None, connections: int | None = None
    ) -> "KubeCluster":
        """The API server found as kubectl finds it (see `load_configuration`).

        `connections` is the most requests the caller makes at once (watches
        included): the client keeps that many connections open for reuse, where
        its default pool (a few per CPU) would open and discard extra ones.
        """
        configuration = client.Configuration()
        if connections is not None:
            configuration.connection_pool_maxsize = connections
        origin = load_configuration(kubeconfig, configuration)
        return cls(client.ApiClient(configuration), origin=origin)

    # ----- nodes

    def get_node(self, name: str) -> Node:
        return self._one(Node, f"node {name}", self.core.read_node, name)

    def list_nodes(self, name: str | None = None) -> Listing[Node]:
        return self._listing(Node, "nodes", self.core.list_node, **_name_selector(name))

    def watch_nodes(self, resource_version: str, name: str | None = None) -> KubeWatch[Node]:
        return KubeWatch(
            Node,
            self.core.list_node,
            self.api,
            resource_version=resource_version,
            timeout_seconds=self.watch_timeout_s,
            **_name_selector(name),
        )

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> Node:
        body = {"metadata": {"annotations": dict(annotations)}}
        return self._one(
            Node, f"node {name}", self.core.patch_node, name, body, _content_type=MERGE_PATCH
        )

    # ----- pods

    def get_pod(self, namespace: str, name: str) -> Pod:
        return self._one(
            Pod, f"pod {namespace}/{name}", self.core.read_namespaced_pod, name, namespace
        )

    def list_pods(self, node_name: str | None = None) -> Listing[Pod]:
        return self._listing(
            Pod, "pods", self.core.list_pod_for_all_namespaces, **_node_selector(node_name)
        )

    def watch_pods(self, resource_version: str, node_name: str | None = None) -> KubeWatch[Pod]:
        return KubeWatch(
            Pod,
            self.core.list_pod_for_all_namespaces,
            self.api,
            resource_version=resource_version,
            timeout_seconds=self.watch_timeout_s,
            **_node_selector(node_name),
        )

    def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str | None = None,
    ) -> Pod:
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version:
            # A merge patch carrying metadata.resourceVersion is applied only to that
            # version; the server answers 409 Conflict otherwise.
            metadata["resourceVersion"] = resource_version
        return self._one(
            Pod,
            f"pod {namespace}/{name}",
            self.core.patch_namespaced_pod,
            name,
            namespace,
            {"metadata": metadata},
            _content_type=MERGE_PATCH,
        )

    def bind_pod(
        self,
        namespace: str,
        name: str,
        node_name: str,
        uid: str = "",
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=namespace,
                uid=uid or None,
                annotations=dict(annotations) if annotations else None,
            ),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node_name),
        )
        try:
            # The server answers with a Status, not a Binding: do not let the client
            # try to read it as one.
            _discard(
                self.core.create_namespaced_pod_binding(
                    name, namespace, body, _preload_content=False
                )
            )
        except ApiException as err:
            if err.status == 409:
                raise self._binding_conflict(namespace, name, err) from err
            raise _translate(err, f"bind pod {namespace}/{name} to node {node_name}") from err

    def _binding_conflict(self, namespace: str, name: str, err: ApiException) -> Conflict:
        message = _message(err)
        assigned = _ASSIGNED.search(message)
        if assigned:
            return AlreadyBound(f"{namespace}/{name}", assigned.group(1))
        if "already assigned" in message or "already bound" in message:
            try:
                node = self.get_pod(namespace, name).spec.node_name
            except ClusterError:
                node = None
            if node:
                return AlreadyBound(f"{namespace}/{name}", node)
        return Conflict(f"bind pod {namespace}/{name}: {message}")

    # ----- events

    def record_event(
        self, ref: ObjectRef, severity: EventSeverity, reason: str, message: str
    ) -> None:
        """Best effort, like client-go's recorder: a failure is logged, never raised,
        because an event must not fail the operation it reports on."""
        namespace = ref.namespace or "default"
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{ref.name}.", namespace=namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1",
                kind=ref.kind,
                name=ref.name,
                namespace=ref.namespace or None,
                uid=ref.uid or None,
            ),
            reason=reason,
            message=message[:1024],
            type=str(severity),
            source=client.V1EventSource(component=EVENT_SOURCE),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            reporting_component=EVENT_SOURCE,
        )
        try:
            _discard(self.core.create_namespaced_event(namespace, event, _preload_content=False))
        except Exception as err:  # the API or the network; see the docstring
            log.warning("could not record event %s on %s %s: %s", reason, ref.kind, ref.name, err)

    # ----- what the components leave behind (`gpushare uninstall-cleanup`)

    def delete_lease(self, namespace: str, name: str) -> None:
        """Raises NotFound when there is no such Lease."""
        leases = client.CoordinationV1Api(self.api)
        self._delete(
            f"delete lease {namespace}/{name}", leases.delete_namespaced_lease, name, namespace
        )

    def delete_secret(self, namespace: str, name: str) -> None:
        """Raises NotFound when there is no such Secret."""
        self._delete(
            f"delete secret {namespace}/{name}", self.core.delete_namespaced_secret, name, namespace
        )

    # ----- helpers

    def _delete(self, what: str, call: Any, *args: Any) -> None:
        try:
            call(*args)
        except ApiException as err:
            raise _translate(err, what) from err
        except Exception as err:  # connection refused, TLS, DNS
            raise ClusterError(f"{what}: {err}") from err

    def _one(self, kind: type[_T], what: str, call: Any, *args: Any, **kwargs: Any) -> _T:
        try:
            obj = call(*args, **kwargs)
        except ApiException as err:
            raise _translate(err, what) from err
        except Exception as err:  # connection refused, TLS, DNS
            raise ClusterError(f"{what}: {err}") from err
        return _convert(kind, self.api.sanitize_for_serialization(obj))

    def _listing(self, kind: type[_T], what: str, call: Any, **kwargs: Any) -> Listing[_T]:
        """A list served from the API server's watch cache (resourceVersion=0: no read
        from etcd), decoded once from its JSON; the watch that follows starts at it."""
        try:
            response = call(resource_version="0", _preload_content=False, **kwargs)
            raw = json.loads(response.data)
        except ApiException as err:
            raise _translate(err, f"list {what}") from err
        except Exception as err:
            raise ClusterError(f"list {what}: {err}") from err
        items = [_convert(kind, item) for item in raw.get("items") or []]
        return Listing(items, (raw.get("metadata") or {}).get("resourceVersion", ""))


def load_configuration(kubeconfig: str | None, configuration: client.Configuration) -> str:
    """Fills `configuration` the way kubectl finds its cluster and says from where:
    the kubeconfig file(s) given, else those listed in $KUBECONFIG, else
    ~/.kube/config, else the service account of the pod it runs in.

    Raises ConfigException naming what it tried when none of them works.
    """
    if kubeconfig:
        if not _existing(kubeconfig):
            raise ConfigException(f"the kubeconfig {kubeconfig} does not exist")
        return _load_kubeconfig(kubeconfig, configuration)
    listed = os.environ.get(KUBECONFIG_ENV, "")
    paths = listed or HOME_KUBECONFIG
    if _existing(paths):
        return _load_kubeconfig(paths, configuration)
    where = f"${KUBECONFIG_ENV} ({listed})" if listed else HOME_KUBECONFIG
    try:
        config.load_incluster_config(client_configuration=configuration)
    except ConfigException as err:
        raise ConfigException(
            f"no Kubernetes API configuration: tried --kubeconfig (not given), {where} "
            f"(no such file) and {IN_CLUSTER} ({err})"
        ) from None
    return IN_CLUSTER


def _existing(paths: str) -> list[str]:
    """The files of a kubeconfig path list (separated as in $KUBECONFIG) that exist."""
    expanded = (os.path.expanduser(path) for path in paths.split(os.pathsep) if path)
    return [path for path in expanded if os.path.isfile(path)]


def _load_kubeconfig(paths: str, configuration: client.Configuration) -> str:
    try:
        config.load_kube_config(config_file=paths, client_configuration=configuration)
    except ConfigException as err:
        raise ConfigException(f"the kubeconfig {paths}: {err}") from None
    return f"kubeconfig {paths}"


def _name_selector(name: str | None) -> dict[str, str]:
    return {"field_selector": f"metadata.name={name}"} if name else {}


def _node_selector(node_name: str | None) -> dict[str, str]:
    return {"field_selector": f"spec.nodeName={node_name}"} if node_name else {}


def _convert(kind: type[_T], raw: Any) -> _T:
    try:
        return kind.model_validate(raw)
    except ValidationError as err:
        raise ClusterError(f"the API sent a {kind.__name__} gpushare cannot read: {err}") from err


def _message(err: ApiException) -> str:
    try:
        status = json.loads(err.body or "")
    except (TypeError, ValueError):
        status = None
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return str(err.reason or err.body or f"HTTP {err.status}")


def _translate(err: ApiException, what: str) -> ClusterError:
    message = f"{what}: {_message(err)}"
    if err.status == 404:
        return NotFound(message)
    if err.status == 409:
        return Conflict(message)
    if err.status == 410:
        return Expired(message)
    return ClusterError(f"{message} (HTTP {err.status})")


def _discard(response: Any) -> None:
    """Reads an answer we do not decode, then hands its connection back: released
    unread, the connection would be dropped (a new one for the next request) or, when
    the body arrives late, garble the next answer read from it."""
    response.drain_conn()
    response.release_conn()
