"""A stand-in for the few Kubernetes API paths gpushare calls, over real HTTP on loopback.

Backed by a MemoryCluster, so resourceVersions, watches from a version, 410 Gone
after compaction, preconditions and "already assigned" behave as the API server's
do. Lists behave as the API server's: with resourceVersion=0 its watch cache answers
whole, ignoring `limit`; otherwise (or with the watch cache off) etcd answers
`limit` objects a page, with a `continue` token for the rest of the same snapshot,
and a token can be made to expire (410) as etcd compaction does. Leases and Secrets
are plain stored objects (get, delete); the resource.k8s.io/v1 routes of DRA mode are
in draroutes.py. It records every request, can be told to fail the next few, and to
refuse some as RBAC would.
"""

import base64
import itertools
import json
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

from gpushare.cluster import AlreadyBound, Conflict, Expired, NotFound
from gpushare.cluster.memory import MemoryCluster
from tests.kubecluster import draroutes


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any
    authorization: str = ""


@dataclass(frozen=True)
class Bookmark:
    resource_version: str


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class ApiServer:
    def __init__(self, cluster: MemoryCluster) -> None:
        self.cluster = cluster
        self.requests: list[Seen] = []
        self.failures: list[int] = []
        """HTTP statuses to answer the next requests with, one each."""
        self.events: list[dict[str, Any]] = []
        self.stored: dict[str, dict[str, Any]] = {}
        """Leases and Secrets by their API path, e.g.
        /apis/coordination.k8s.io/v1/namespaces/NS/leases/NAME."""
        self.forbidden: dict[tuple[str, str], str] = {}
        """(method, path) -> the message of the 403 Forbidden it is answered with."""
        self.watch_cache = True
        """False: lists with resourceVersion=0 are served from etcd (in pages), as when
        the API server's watch cache is off or not ready."""
        self.expire_continues = 0
        """The next this many continuations are answered 410 Expired."""
        self.between_pages: Callable[[], None] | None = None
        """Called after each page that has more to follow (to change the cluster)."""
        self._snapshots: dict[int, tuple[str, list[dict[str, Any]]]] = {}
        self._snapshot_ids = itertools.count(1)
        self.watch_gate = threading.Event()
        """Cleared, new watch requests wait until it is set again."""
        self.watch_gate.set()
        self._watches: set = set()
        self._lock = threading.Lock()
        self.connections = 0
        """TCP connections accepted: a client that reuses its connections opens few."""
        self.httpd = _Server(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.end_watches()
        self.httpd.shutdown()
        self.httpd.server_close()

    def end_watches(self) -> None:
        """Ends every open watch stream, as an API server restart would."""
        with self._lock:
            watches, self._watches = list(self._watches), set()
        for watch in watches:
            watch.stop()

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig at `path` whose current context is this server."""
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stub", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {"token": "secret-token"}}],
            "contexts": [{"name": "c", "context": {"cluster": "stub", "user": "u"}}],
            "current-context": "c",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(kubeconfig))
        return path

    def store(self, obj: dict[str, Any]) -> str:
        """Keeps a Lease or Secret manifest; returns its API path."""
        prefix, plural = _STORED_KINDS[obj["kind"]]
        meta = obj["metadata"]
        path = f"{prefix}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"
        self.stored[path] = obj
        return path

    def seen(self, method: str, path_part: str = "") -> list[Seen]:
        return [r for r in self.requests if r.method == method and path_part in r.path]

    # ----- routing

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any):
        """(status, JSON body) or (200, watch) for a watch."""
        with self._lock:
            if self.failures:
                code = self.failures.pop(0)
                return code, status(code, "InternalError", f"injected failure {code}")
        if (method, path) in self.forbidden:
            return 403, status(403, "Forbidden", self.forbidden[method, path])
        if _STORED.fullmatch(path):
            return self._stored(method, path)
        if (query.get("watch") or [""])[0] == "true":
            self.watch_gate.wait(10)
        parts = path.strip("/").split("/")
        if parts[:3] == draroutes.PREFIX:
            return draroutes.serve(self.cluster, method, parts[3:], query, body)
        if parts[:2] != ["api", "v1"]:
            return 404, status(404, "NotFound", f"no route {path}")
        rest = parts[2:]
        one = lambda key: (query.get(key) or [""])[0]  # noqa: E731
        try:
            if rest == ["nodes"] and method == "GET":
                selector = one("fieldSelector")
                name = selector.split("=", 1)[1] if selector.startswith("metadata.name=") else None
                if one("watch") == "true":
                    watch = self.cluster.watch_nodes(one("resourceVersion"), name)
                    return 200, self._watch(watch, query)
                return self._list("NodeList", lambda: self.cluster.list_nodes(name), one)
            if rest[:1] == ["nodes"] and len(rest) == 2:
                if method == "GET":
                    return 200, self.cluster.get_node(rest[1]).to_manifest()
                if method == "PATCH":
                    annotations = body["metadata"]["annotations"]
                    return 200, self.cluster.patch_node_annotations(
                        rest[1], annotations
                    ).to_manifest()
            if rest == ["pods"] and method == "GET":
                selector = one("fieldSelector")
                node = selector.split("=", 1)[1] if selector.startswith("spec.nodeName=") else None
                if one("watch") == "true":
                    watch = self.cluster.watch_pods(one("resourceVersion"), node)
                    return 200, self._watch(watch, query)
                return self._list("PodList", lambda: self.cluster.list_pods(node), one)
            if len(rest) >= 4 and rest[0] == "namespaces" and rest[2] == "pods":
                return self._pod(method, rest[1], rest[3], rest[4:], body)
            if len(rest) == 3 and rest[0] == "namespaces" and rest[2] == "events":
                self.events.append(body)
                return 201, body
        except NotFound as err:
            return 404, status(404, "NotFound", str(err))
        except Expired as err:
            return 200, _ExpiredWatch(str(err))
        return 405, status(405, "MethodNotAllowed", f"{method} {path}")

    def _pod(self, method: str, ns: str, name: str, sub: list[str], body: Any):
        if not sub and method == "GET":
            return 200, self.cluster.get_pod(ns, name).to_manifest()
        if not sub and method == "PATCH":
            meta = body["metadata"]
            try:
                pod = self.cluster.patch_pod_annotations(
                    ns, name, meta.get("annotations", {}), meta.get("resourceVersion")
                )
            except Conflict as err:
                return 409, status(409, "Conflict", str(err))
            return 200, pod.to_manifest()
        if sub == ["binding"] and method == "POST":
            meta = body.get("metadata", {})
            if meta.get("name") != name:
                return 400, status(400, "BadRequest", "name in the body does not match the URL")
            try:
                self.cluster.bind_pod(
                    ns, name, body["target"]["name"], meta.get("uid", ""), meta.get("annotations")
                )
            except AlreadyBound as err:
                message = (
                    f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} '
                    f'is already assigned to node "{err.node}"'
                )
                return 409, status(409, "Conflict", message)
            except Conflict as err:
                return 409, status(409, "Conflict", str(err))
            return 201, {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            }
        return 405, status(405, "MethodNotAllowed", f"{method} pods/{'/'.join(sub)}")

    def _stored(self, method: str, path: str):
        if method not in ("GET", "DELETE"):
            return 405, status(405, "MethodNotAllowed", f"{method} {path}")
        if path not in self.stored:
            plural, name = path.split("/")[-2:]
            return 404, status(404, "NotFound", f'{plural} "{name}" not found')
        return 200, self.stored[path] if method == "GET" else self.stored.pop(path)

    def _list(self, kind: str, read, one):
        """(status, JSON body) of one list request, or of one page of it."""
        token = one("continue")
        if token:
            return self._next_page(kind, token, one)
        listing = read()
        items = [item.to_manifest() for item in listing.items]
        limit = int(one("limit") or 0)
        from_cache = one("resourceVersion") == "0" and self.watch_cache
        if from_cache or not limit or len(items) <= limit:
            return 200, _list_body(kind, listing.resource_version, items)
        with self._lock:
            snapshot = next(self._snapshot_ids)
            self._snapshots[snapshot] = (listing.resource_version, items)
        return self._page(kind, snapshot, 0, limit)

    def _next_page(self, kind: str, token: str, one):
        if one("resourceVersion"):
            message = "specifying resource version is not allowed when using continue"
            return 400, status(400, "BadRequest", message)
        snapshot, offset = json.loads(base64.urlsafe_b64decode(token))
        with self._lock:
            expired = self.expire_continues > 0 or snapshot not in self._snapshots
            if expired:
                self.expire_continues = max(self.expire_continues - 1, 0)
                self._snapshots.pop(snapshot, None)
        if expired:
            message = (
                "The provided continue parameter is too old to display a consistent list "
                "result. You can start a new list without the continue parameter."
            )
            return 410, status(410, "Expired", message)
        return self._page(kind, snapshot, offset, int(one("limit") or 0))

    def _page(self, kind: str, snapshot: int, offset: int, limit: int):
        with self._lock:
            version, items = self._snapshots[snapshot]
        end = offset + limit if limit else len(items)
        body = _list_body(kind, version, items[offset:end])
        if end < len(items):
            body["metadata"]["continue"] = base64.urlsafe_b64encode(
                json.dumps([snapshot, end]).encode()
            ).decode()
            body["metadata"]["remainingItemCount"] = len(items) - end
            if self.between_pages is not None:
                self.between_pages()
        else:
            with self._lock:
                self._snapshots.pop(snapshot, None)
        return 200, body

    def bookmark(self, resource_version: str) -> None:
        """Sends a BOOKMARK at this version down every open watch that asked for them."""
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            if getattr(watch, "bookmarks", False):
                watch.push(Bookmark(resource_version))

    def _watch(self, watch, query):
        watch.bookmarks = (query.get("allowWatchBookmarks") or [""])[0] == "true"
        with self._lock:
            self._watches.add(watch)
        timeout = float((query.get("timeoutSeconds") or ["300"])[0])
        timer = threading.Timer(timeout, watch.stop)
        timer.daemon = True
        timer.start()
        return watch


def _list_body(kind: str, version: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": kind,
        "apiVersion": "v1",
        "metadata": {"resourceVersion": version},
        "items": items,
    }


_STORED_KINDS = {
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    "Secret": ("/api/v1", "secrets"),
}
_STORED = re.compile(
    "|".join(
        f"{re.escape(prefix)}/namespaces/[^/]+/{plural}/[^/]+"
        for prefix, plural in _STORED_KINDS.values()
    )
)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients closing kept-alive connections are routine, not worth a traceback.
        pass


class _ExpiredWatch:
    def __init__(self, message: str) -> None:
        self.message = message

    def __iter__(self):
        return iter(())


def _handler(api: ApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            # An answer is two writes (head, body): with Nagle's algorithm the body
            # waits for the client's delayed ACK of the head, 40 ms, as no Go server does.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with api._lock:
                api.connections += 1

        def _serve(self, method: str) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            api.requests.append(
                Seen(
                    method,
                    url.path,
                    query,
                    self.headers.get("Content-Type", ""),
                    body,
                    self.headers.get("Authorization", ""),
                )
            )
            code, answer = api.handle(method, url.path, query, body)
            if isinstance(answer, dict):
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self._stream(answer)

        def _stream(self, watch: Any) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                if isinstance(watch, _ExpiredWatch):
                    self._chunk({"type": "ERROR", "object": status(410, "Expired", watch.message)})
                else:
                    for event in watch:
                        if isinstance(event, Bookmark):
                            meta = {"resourceVersion": event.resource_version}
                            self._chunk({"type": "BOOKMARK", "object": {"metadata": meta}})
                            continue
                        self._chunk(
                            {"type": event.type.value, "object": event.object.to_manifest()}
                        )
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                watch.stop()
            self.close_connection = True

        def _chunk(self, event: dict[str, Any]) -> None:
            line = json.dumps(event).encode() + b"\n"
            self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

    return Handler
