"""The Kubernetes-API adapter of the cluster port, on the official `kubernetes` client.

API objects are converted to gpushare's typed `Pod` and `Node` through the
client's own serialisation (camelCase JSON, as the API server sends it), and
API errors become the port's errors (kubecluster/apicall.py): 404 NotFound, 409
Conflict or AlreadyBound, 410 Expired, 422 Invalid, anything else ClusterError with the
server's message. The resource.k8s.io objects of DRA mode are in kubecluster/dra.py.
"""

import contextlib
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
from kubernetes.watch.watch import iter_resp_lines

from gpushare.cluster import (
    AlreadyBound,
    ClusterError,
    Conflict,
    EventSeverity,
    EventType,
    Expired,
    Listing,
    ObjectRef,
    WatchEvent,
)
from gpushare.commandline import InputFileError, read_yaml
from gpushare.kubecluster.apicall import (
    decoded,
    discard,
    perform,
    port_error,
    read_json,
    status_message,
    translated,
)
from gpushare.kubecluster.dra import KubeDra
from gpushare.objects import Node, Pod

log = logging.getLogger(__name__)

_T = TypeVar("_T", Node, Pod)

MERGE_PATCH = "application/merge-patch+json"
LIST_PAGE = 500
"""Objects per page where a list comes in pages (client-go's reflector asks as many)."""
WATCH_TIMEOUT_S = 300
"""The server ends each watch after this long; the cache then resumes from the
last resourceVersion it saw (what client-go does with its random 5-10 min)."""

EVENT_SOURCE = "gpushare"

KUBECONFIG_ENV = "KUBECONFIG"
HOME_KUBECONFIG = "~/.kube/config"
IN_CLUSTER = "the in-cluster service account"

_ASSIGNED = re.compile(r'is already assigned to node "([^"]*)"')


class KubeWatch(Iterator[WatchEvent[_T]]):
    """One watch request, with bookmarks, opened when made: `watch_nodes`/`watch_pods`
    return once the server has accepted it (a refusal raises there). Iterates events,
    decoded once from the API's JSON into the core's models, until the server ends the
    stream or stop(). `resume_from` is the latest event's or bookmark's version."""

    def __init__(self, kind: type[_T], what: str, list_call: Any, **kwargs: Any) -> None:
        self._kind: type[_T] = kind
        self._what = what
        self._stopped = False
        self.resume_from = ""
        self._response = perform(
            f"watch {what}",
            list_call,
            watch=True,
            allow_watch_bookmarks=True,
            _preload_content=False,
            **kwargs,
        )
        self._lines = iter_resp_lines(self._response)

    def __iter__(self) -> "KubeWatch[_T]":
        return self

    def __next__(self) -> WatchEvent[_T]:
        while True:
            raw = self._next_event()
            kind = raw.get("type")
            obj = raw.get("object") or {}
            if kind == "ERROR":  # e.g. 410 Expired: the version left the server's window
                message = obj.get("message") or obj.get("reason") or "an error"
                raise port_error(obj.get("code"), f"watch {self._what}: {message}")
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self.resume_from = version
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                return WatchEvent(EventType(kind), decoded(self._kind, obj))
            # BOOKMARK and anything newer: only its version matters; keep reading.

    def stop(self) -> None:
        """Ends the iteration, at once even while it waits for the next event."""
        self._stopped = True
        shutdown = getattr(self._response, "shutdown", None)  # urllib3 >= 2.3
        if shutdown is None:
            return  # the iteration ends at the next event or the server's timeout
        with contextlib.suppress(Exception):  # the stream had ended: nothing to interrupt
            shutdown()

    def _next_event(self) -> dict[str, Any]:
        while True:
            try:
                line = next(self._lines)
            except StopIteration:
                self._response.release_conn()  # read to its end: the connection is reusable
                raise
            except Exception as err:  # the connection dropped mid-stream, or stop()
                self._response.close()
                if self._stopped:
                    raise StopIteration from None
                raise ClusterError(f"watch {self._what}: stream failed: {err}") from err
            if self._stopped:
                self._response.close()
                raise StopIteration
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError as err:
                raise ClusterError(f"watch {self._what}: not JSON: {line[:200]!r}") from err
            if isinstance(event, dict):
                return event


class KubeCluster(KubeDra):
    """Implements gpushare.cluster.Cluster, and gpushare.cluster.DraCluster (KubeDra),
    against a Kubernetes API server."""

    def __init__(
        self,
        api: client.ApiClient,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        origin: str = "",
    ) -> None:
        super().__init__(api)
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
            "nodes",
            self.core.list_node,
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
            "pods",
            self.core.list_pod_for_all_namespaces,
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
        # Plain dicts, not the client's generated models: serialising those walks every
        # attribute by reflection, a cost paid on each bind (and event) under load.
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid
        if annotations:
            metadata["annotations"] = dict(annotations)
        body: Any = {  # Any: the client's signature names its model; it sends dicts as they are
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
        }
        try:
            # The server answers with a Status, not a Binding: do not let the client
            # try to read it as one.
            discard(
                self.core.create_namespaced_pod_binding(
                    name, namespace, body, _preload_content=False
                )
            )
        except ApiException as err:
            if err.status == 409:
                raise self._binding_conflict(namespace, name, err) from err
            raise translated(err, f"bind pod {namespace}/{name} to node {node_name}") from err

    def _binding_conflict(self, namespace: str, name: str, err: ApiException) -> Conflict:
        message = status_message(err)
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
        stamp = now.isoformat(timespec="seconds").replace("+00:00", "Z")
        involved = {"apiVersion": "v1", "kind": ref.kind, "name": ref.name}
        if ref.namespace:
            involved["namespace"] = ref.namespace
        if ref.uid:
            involved["uid"] = ref.uid
        event: Any = {  # Any, as the Binding's body above
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.name}.", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": str(severity),
            "source": {"component": EVENT_SOURCE},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": EVENT_SOURCE,
        }
        try:
            discard(self.core.create_namespaced_event(namespace, event, _preload_content=False))
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
        perform(what, call, *args)

    def _one(self, kind: type[_T], what: str, call: Any, *args: Any, **kwargs: Any) -> _T:
        """One object, decoded once from the API's JSON into the core's model: not
        through the client's generated models and back (two reflective walks of the
        object, the larger part of a bind's CPU)."""
        response = perform(what, call, *args, _preload_content=False, **kwargs)
        return decoded(kind, read_json(what, response))

    def _listing(self, kind: type[_T], what: str, call: Any, **kwargs: Any) -> Listing[_T]:
        """A list the way client-go's reflector makes one: from the API server's watch
        cache (resourceVersion=0: no read from etcd; the cache answers whole, ignoring
        the limit), following `continue` page by page where the answer comes in pages
        (the cache is off or not ready and etcd answers); if a continuation has expired
        (410: etcd compacted the first page's version meanwhile), once more as a
        consistent list from etcd (resourceVersion unset), in pages too."""
        try:
            return self._pages(kind, f"list {what}", call, "0", **kwargs)
        except Expired as err:
            log.info("list %s: %s; listing again from the start", what, err)
        try:
            return self._pages(kind, f"list {what}", call, None, **kwargs)
        except Expired as err:
            # Not Expired: the caller would list again at once, without backing off.
            raise ClusterError(f"list {what}: expired again while paging: {err}") from err

    def _pages(
        self, kind: type[_T], what: str, call: Any, version: str | None, **kwargs: Any
    ) -> Listing[_T]:
        """Every page of one list, each decoded once from its JSON into the core's
        models; the listing's version is the last page's (the watch starts there)."""
        items: list[_T] = []
        position: dict[str, str] = {"resource_version": version} if version else {}
        while True:
            response = perform(
                what, call, limit=LIST_PAGE, _preload_content=False, **position, **kwargs
            )
            raw = read_json(what, response)
            items.extend(decoded(kind, item) for item in raw.get("items") or [])
            del raw["items"]  # decoded: let the page's JSON go before the next one
            meta = raw.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return Listing(items, meta.get("resourceVersion", ""))
            # A continuation carries no resourceVersion: the token holds the first page's.
            position = {"_continue": token}


def load_configuration(kubeconfig: str | None, configuration: client.Configuration) -> str:
    """Fills `configuration` the way kubectl finds its cluster and says from where:
    the kubeconfig file(s) given, else those listed in $KUBECONFIG, else
    ~/.kube/config, else the service account of the pod it runs in.

    Raises ConfigException naming what it tried when none of them works.
    """
    if kubeconfig:
        return _load_kubeconfig(kubeconfig, configuration, given=True)
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


def _check_kubeconfig(path: str) -> None:
    """Raises ConfigException saying why `path` cannot be a kubeconfig: checked before the
    client reads it, which would block on a FIFO and fail with a TypeError on a file that
    is YAML but not a mapping."""
    try:
        documents = read_yaml(path, "the kubeconfig")
    except InputFileError as err:
        raise ConfigException(str(err)) from None
    if not documents or not isinstance(documents[0], dict):
        raise ConfigException(
            f"the kubeconfig {path} is not a kubeconfig: it holds no mapping of clusters, "
            "contexts and users"
        )


def _load_kubeconfig(paths: str, configuration: client.Configuration, given: bool = False) -> str:
    """Loads the kubeconfig files of `paths`; each must exist when `given` (a flag names
    them), else those missing are skipped, as kubectl skips them in $KUBECONFIG."""
    listed = [os.path.expanduser(path) for path in paths.split(os.pathsep) if path]
    for path in listed if given else _existing(paths):
        _check_kubeconfig(path)
    try:
        config.load_kube_config(config_file=paths, client_configuration=configuration)
    except ConfigException as err:
        raise ConfigException(f"the kubeconfig {paths}: {err}") from None
    except (TypeError, KeyError, AttributeError, ValueError) as err:
        # The client indexes the mapping as it finds it: a field of the wrong shape (a
        # string where a list of clusters belongs) fails inside it with one of these.
        raise ConfigException(
            f"the kubeconfig {paths} is not a valid kubeconfig ({type(err).__name__}: {err})"
        ) from None
    return f"kubeconfig {paths}"


def _name_selector(name: str | None) -> dict[str, str]:
    return {"field_selector": f"metadata.name={name}"} if name else {}


def _node_selector(node_name: str | None) -> dict[str, str]:
    return {"field_selector": f"spec.nodeName={node_name}"} if node_name else {}
