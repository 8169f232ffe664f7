"""The HTTP faces of the extender: the scheduler-extender API (for kube-scheduler
alone, on loopback), the operational endpoints (health, metrics, inspect), and the
admission webhook (served on its own TLS port).

Bodies are read and checked by hand (`wire.parse`) rather than by FastAPI's
request models, so that a bad body is a 400 naming the field in the answer
shape kube-scheduler reads (`{"Error": ...}`), never a 422 or a 500, and so a
5,000-node answer is encoded once with json instead of through a model dump.
Before any of that, a body is read only within its endpoint's limit
(gpushare.extender.limits) and deadline, or refused naming them.
"""

import logging
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import Any

from anyio import CapacityLimiter, to_thread
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter

from gpushare.extender import verbs, webhook
from gpushare.extender.argsreader import ExtenderArgsReader
from gpushare.extender.binder import Binder
from gpushare.extender.bodies import JSON, BodyRefused, read_json_body
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.draclaims import ClaimTemplates
from gpushare.extender.inspect import cluster_report, node_report
from gpushare.extender.limits import (
    ADMISSION_REVIEW_MAX,
    BINDING_ARGS_MAX,
    DEFAULT_READ_LIMITS,
    EXTENDER_ARGS_MAX,
    PREEMPTION_ARGS_MAX,
    ReadLimits,
)
from gpushare.extender.metrics import ExtenderMetrics, Verb, Webhook
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
        claim_templates: ClaimTemplates | None = None,
    ) -> None:
        self.cache = cache
        self.claim_templates = claim_templates
        """Set in DRA mode: the webhook rewrites GPU pods to claims of these templates."""
        self.binder = binder
        self.metrics = metrics
        self.scheduler_names = tuple(scheduler_names)
        """Every name our scheduler serves; the first is what the mutating webhook writes."""
        self.describe = describe
        self.args_reader = ExtenderArgsReader()

    # The verbs, bytes in and bytes out, so the benchmark times exactly what HTTP serves.

    def filter(self, body: bytes) -> bytes:
        args = self.args_reader.read(body)
        return verbs.filter_nodes(self.cache, self.metrics, args, self.args_reader)

    def prioritize(self, body: bytes) -> bytes:
        return verbs.prioritize_nodes(self.cache, self.args_reader.read(body))

    def prioritize_claims(self, body: bytes) -> bytes:
        return verbs.prioritize_claims(self.cache, self.args_reader.read(body))

    def bind(self, body: bytes) -> bytes:
        return dumps({"Error": self.binder.bind(parse(BindingArgs, body))})

    def preempt(self, body: bytes) -> bytes:
        return verbs.preempt_nodes(self.cache, parse(PreemptionArgs, body))

    def validate(self, body: bytes) -> bytes:
        review = parse(AdmissionReview, body)
        answer = webhook.validate(
            review, self.scheduler_names, self.cache.choice, self.cache.gpu_shapes()
        )
        allowed = str(answer["response"]["allowed"]).lower()
        self.metrics.admission.labels(Webhook.VALIDATE, allowed).inc()
        return dumps(answer)

    def mutate(self, body: bytes) -> bytes:
        answer = webhook.mutate(
            parse(AdmissionReview, body), self.scheduler_names[0], self.claim_templates
        )
        allowed = str(answer["response"]["allowed"]).lower()
        self.metrics.admission.labels(Webhook.MUTATE, allowed).inc()
        return dumps(answer)


def scheduler_app(
    extender: Extender, url_prefix: str, limits: ReadLimits = DEFAULT_READ_LIMITS
) -> FastAPI:
    """The scheduler verbs alone: what the listener on loopback serves to kube-scheduler."""
    return _app("gpushare scheduler extender", _verbs(extender, url_prefix, limits))


def ops_app(extender: Extender) -> FastAPI:
    """Health, readiness, version, metrics and inspect: the listener a Service may reach."""
    return _app("gpushare extender operations", _operations(extender))


def extender_app(
    extender: Extender, url_prefix: str, limits: ReadLimits = DEFAULT_READ_LIMITS
) -> FastAPI:
    """The verbs and the operational endpoints on one listener, for processes that serve
    only themselves on loopback (the demo, tests); gpushare-extender splits them."""
    return _app(
        "gpushare scheduler extender",
        _verbs(extender, url_prefix, limits),
        _operations(extender),
    )


def webhook_app(extender: Extender, limits: ReadLimits = DEFAULT_READ_LIMITS) -> FastAPI:
    router = APIRouter()
    for verb, handler in ((Webhook.VALIDATE, extender.validate), (Webhook.MUTATE, extender.mutate)):
        # Inline: a review is only decoded and judged (well under a millisecond), so a
        # hop to the thread pool and back would cost more than the work, on every pod
        # created while binds hold the pool's threads.
        endpoint = _endpoint(
            verb,
            handler,
            extender.metrics,
            ADMISSION_REVIEW_MAX,
            limits,
            _for_api_server,
            errors=extender.metrics.admission_errors.labels(verb),
            inline=True,
        )
        router.add_api_route(f"/{verb}", endpoint, methods=["POST"])

    @router.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return _app("gpushare admission webhook", router)


def _app(title: str, *routers: APIRouter) -> FastAPI:
    app = FastAPI(title=title, version=VERSION, docs_url=None, redoc_url=None, openapi_url=None)
    for router in routers:
        app.include_router(router)
    return app


def _verbs(extender: Extender, url_prefix: str, limits: ReadLimits) -> APIRouter:
    router = APIRouter()
    prefix = "/" + url_prefix.strip("/") if url_prefix.strip("/") else ""
    verbs_ = {
        Verb.FILTER: (extender.filter, EXTENDER_ARGS_MAX),
        Verb.PRIORITIZE: (extender.prioritize, EXTENDER_ARGS_MAX),
        Verb.PRIORITIZE_CLAIMS: (extender.prioritize_claims, EXTENDER_ARGS_MAX),
        Verb.BIND: (extender.bind, BINDING_ARGS_MAX),
        Verb.PREEMPT: (extender.preempt, PREEMPTION_ARGS_MAX),
    }
    for verb, (handler, limit) in verbs_.items():
        # A plain Starlette route: the endpoint reads the request itself, and FastAPI's
        # request handling around it costs about 0.06 ms of the event loop's CPU a
        # request (0.27 against 0.21 ms for a 100 KB POST), a sixth of what HTTP adds.
        router.add_route(
            f"{prefix}/{verb}",
            _endpoint(
                verb,
                handler,
                extender.metrics,
                limit,
                limits,
                _for_scheduler,
                inline=verb is not Verb.BIND,
                at_once=BINDS_AT_ONCE if verb is Verb.BIND else None,
            ),
            methods=["POST"],
            name=verb,
        )
    return router


def _operations(extender: Extender) -> APIRouter:
    """GET endpoints: they take no body and never read one (the server closes the
    connection of a request answered before its body came)."""
    router = APIRouter()
    cache = extender.cache

    @router.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/readyz")
    def readyz() -> Response:
        if cache.synced:
            return JSONResponse({"status": "ready"})
        return JSONResponse(
            {"status": "waiting for the first full list of nodes and pods"}, status_code=503
        )

    @router.get("/version")
    def version() -> dict[str, Any]:
        return {"version": VERSION, "configuration": extender.describe}

    @router.get("/metrics")
    def metrics() -> Response:
        return Response(extender.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @router.get("/inspect")
    def inspect_all() -> dict[str, Any]:
        return cluster_report(cache)

    @router.get("/inspect/{node}")
    def inspect_node(node: str) -> Response:
        report = node_report(cache, node)
        if report is None:
            return JSONResponse({"error": f"node {node} is not known to the extender"}, 404)
        return JSONResponse(report)

    return router


def _for_scheduler(verb: str, status: int, message: str) -> Response:
    """kube-scheduler reads an error as ExtenderFilterResult/BindingResult's Error."""
    return Response(dumps({"Error": for_scheduler(f"{verb}: {message}")}), status, media_type=JSON)


def _for_api_server(verb: str, status: int, message: str) -> Response:
    """The API server's client decodes a non-200 body that is a metav1.Status into the
    error it reports ("failed calling webhook ...: <message>")."""
    answer = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": f"{verb}: {message}",
        "reason": HTTPStatus(status).phrase.replace(" ", ""),
        "code": status,
    }
    return Response(dumps(answer), status, media_type=JSON)


def _endpoint(
    verb: str,
    handler: Callable[[bytes], bytes],
    metrics: ExtenderMetrics,
    limit: int,
    limits: ReadLimits,
    refusal: Callable[[str, int, str], Response],
    inline: bool = False,
    at_once: int | None = None,
    errors: Counter | None = None,
) -> Callable[[Request], Any]:
    """An endpoint that reads at most `limit` bytes of JSON in time, times the handler,
    and turns a bad body into a 4xx naming the field or the limit, written by
    `refusal` in the shape the caller reads.

    `inline` handlers run on the event loop: filter, prioritize, preempt and the
    admission reviews only compute (a few milliseconds at most), so a hop to the
    thread pool would cost more than it saves. Bind waits on the API server and runs
    in the pool, at most `at_once` calls at a time when given. `errors`, when given,
    counts the requests answered with an error status instead of an answer (a refused
    body, a handler that failed).
    """
    latency = metrics.latency.labels(verb)
    limiter: CapacityLimiter | None = None  # None: anyio's default thread pool

    async def endpoint(request: Request) -> Response:
        nonlocal limiter
        try:
            body = await read_json_body(request, limit, limits.body_deadline)
        except BodyRefused as refused:
            log.info("%s: refused: %s", verb, refused.message)
            _count(errors)
            response = refusal(verb, refused.status, refused.message)
            if refused.status != HTTPStatus.UNSUPPORTED_MEDIA_TYPE:
                # The body may be left unread, so the server closes the connection; said
                # in the answer, a client does not send its next request on it and see
                # a reset (a pooled client did, under load).
                response.headers["connection"] = "close"
            return response
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
            _count(errors)
            return refusal(verb, 400, str(err))
        except Exception:
            _count(errors)  # answered 500 by the framework
            raise
        finally:
            latency.observe(time.perf_counter() - started)
        return Response(answer, media_type=JSON)

    endpoint.__name__ = f"{verb}_endpoint"
    return endpoint


def _count(errors: Counter | None) -> None:
    if errors is not None:
        errors.inc()
