"""The HTTP faces of the extender: the scheduler-extender API with its operational
endpoints, and the admission webhook (served on its own TLS port).

Bodies are read and checked by hand (`wire.parse`) rather than by FastAPI's
request models, so that a bad body is a 400 naming the field in the answer
shape kube-scheduler reads (`{"Error": ...}`), never a 422 or a 500, and so a
5,000-node answer is encoded once with json instead of through a model dump.
"""

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from anyio import CapacityLimiter, to_thread
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from gpushare.extender import verbs, webhook
from gpushare.extender.argsreader import ExtenderArgsReader
from gpushare.extender.binder import Binder
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.inspect import cluster_report, node_report
from gpushare.extender.metrics import ExtenderMetrics
from gpushare.extender.version import VERSION
from gpushare.extender.wire import (
    AdmissionReview,
    BindingArgs,
    PreemptionArgs,
    WireError,
    dumps,
    for_scheduler,
    parse,
)

log = logging.getLogger(__name__)

JSON = "application/json"

BINDS_AT_ONCE = 40
"""Binds that run at once, each in a worker thread waiting on the API server; further
binds wait for a thread. It sizes the API client's pool (service.API_CONNECTIONS)."""


class Extender:
    """What the HTTP layer serves: the cache, the binder and the metrics."""

    def __init__(
        self,
        cache: SchedulerCache,
        binder: Binder,
        metrics: ExtenderMetrics,
        scheduler_names: Sequence[str],
        describe: str = "",
    ) -> None:
        self.cache = cache
        self.binder = binder
        self.metrics = metrics
        self.scheduler_names = tuple(scheduler_names)
        """Every name our scheduler serves; the first is what the mutating webhook writes."""
        self.describe = describe
        self.args_reader = ExtenderArgsReader()

    # The verbs, bytes in and bytes out, so the benchmark times exactly what HTTP serves.

    def filter(self, body: bytes) -> bytes:
        return verbs.filter_nodes(self.cache, self.metrics, self.args_reader.read(body))

    def prioritize(self, body: bytes) -> bytes:
        return verbs.prioritize_nodes(self.cache, self.args_reader.read(body))

    def bind(self, body: bytes) -> bytes:
        return dumps({"Error": self.binder.bind(parse(BindingArgs, body))})

    def preempt(self, body: bytes) -> bytes:
        return verbs.preempt_nodes(self.cache, parse(PreemptionArgs, body))

    def validate(self, body: bytes) -> bytes:
        review = parse(AdmissionReview, body)
        answer = webhook.validate(review, self.scheduler_names, self.cache.policy_names)
        allowed = str(answer["response"]["allowed"]).lower()
        self.metrics.admission.labels("validate", allowed).inc()
        return dumps(answer)

    def mutate(self, body: bytes) -> bytes:
        answer = webhook.mutate(parse(AdmissionReview, body), self.scheduler_names[0])
        self.metrics.admission.labels("mutate", "true").inc()
        return dumps(answer)


def extender_app(extender: Extender, url_prefix: str) -> FastAPI:
    app = FastAPI(
        title="gpushare scheduler extender",
        version=VERSION,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    prefix = "/" + url_prefix.strip("/") if url_prefix.strip("/") else ""
    verbs_ = {
        "filter": extender.filter,
        "prioritize": extender.prioritize,
        "bind": extender.bind,
        "preempt": extender.preempt,
    }
    for verb, handler in verbs_.items():
        app.add_api_route(
            f"{prefix}/{verb}",
            _endpoint(
                verb,
                handler,
                extender.metrics,
                inline=verb != "bind",
                at_once=BINDS_AT_ONCE if verb == "bind" else None,
            ),
            methods=["POST"],
            name=verb,
        )
    cache = extender.cache

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz() -> Response:
        if cache.synced:
            return JSONResponse({"status": "ready"})
        return JSONResponse(
            {"status": "waiting for the first full list of nodes and pods"}, status_code=503
        )

    @app.get("/version")
    def version() -> dict[str, Any]:
        return {"version": VERSION, "configuration": extender.describe}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(extender.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/inspect")
    def inspect_all() -> dict[str, Any]:
        return cluster_report(cache)

    @app.get("/inspect/{node}")
    def inspect_node(node: str) -> Response:
        report = node_report(cache, node)
        if report is None:
            return JSONResponse({"error": f"node {node} is not known to the extender"}, 404)
        return JSONResponse(report)

    return app


def webhook_app(extender: Extender) -> FastAPI:
    app = FastAPI(
        title="gpushare admission webhook",
        version=VERSION,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.add_api_route(
        "/validate", _endpoint("validate", extender.validate, extender.metrics), methods=["POST"]
    )
    app.add_api_route(
        "/mutate", _endpoint("mutate", extender.mutate, extender.metrics), methods=["POST"]
    )

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _endpoint(
    verb: str,
    handler: Callable[[bytes], bytes],
    metrics: ExtenderMetrics,
    inline: bool = False,
    at_once: int | None = None,
) -> Callable[[Request], Any]:
    """An endpoint that times the handler and turns a bad body into a 400 naming the field.

    `inline` handlers run on the event loop: filter, prioritize and preempt only
    compute (a few milliseconds at most), so a hop to the thread pool would cost
    more than it saves. Bind waits on the API server and runs in the pool, at most
    `at_once` calls at a time when given.
    """
    latency = metrics.latency.labels(verb)
    limiter: CapacityLimiter | None = None  # None: anyio's default thread pool

    async def endpoint(request: Request) -> Response:
        nonlocal limiter
        body = await request.body()
        started = time.perf_counter()
        try:
            if inline:
                answer = handler(body)
            else:
                if at_once is not None and limiter is None:
                    limiter = CapacityLimiter(at_once)  # here: older anyio needs a running loop
                answer = await to_thread.run_sync(handler, body, limiter=limiter)
        except WireError as err:
            log.info("%s: bad request: %s", verb, err)
            error = for_scheduler(f"{verb}: {err}")
            return Response(dumps({"Error": error}), 400, media_type=JSON)
        finally:
            latency.observe(time.perf_counter() - started)
        return Response(answer, media_type=JSON)

    endpoint.__name__ = f"{verb}_endpoint"
    return endpoint
