"""One extender, assembled: its configuration, the cache fed by two watches, the
binder and the queue posting its events, the requeue worker, the workers posting
events on pods naming a scheduler nobody serves and on damaged allocation records,
the metrics and the two HTTP apps, over any gpushare.cluster.Cluster."""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI

from gpushare.cluster import Cluster, DraCluster
from gpushare.extender.app import (
    BINDS_AT_ONCE,
    Extender,
    extender_app,
    ops_app,
    scheduler_app,
    webhook_app,
)
from gpushare.extender.binder import Binder
from gpushare.extender.cache import SchedulerCache
from gpushare.extender.damaged import DamagedRecordReporter
from gpushare.extender.draclaims import ClaimTemplates
from gpushare.extender.eventqueue import PodEventQueue
from gpushare.extender.limits import DEFAULT_READ_LIMITS, ReadLimits
from gpushare.extender.metrics import ExtenderMetrics
from gpushare.extender.mirror import interesting
from gpushare.extender.policychoice import PolicyChoice
from gpushare.extender.requeue import Requeuer
from gpushare.extender.schedulernames import check_scheduler_names
from gpushare.extender.unserved import UnservedReporter
from gpushare.extender.version import VERSION
from gpushare.kubecluster.watchcache import WatchCache
from gpushare.placement.policies import DEFAULT_PLACEMENT, POLICIES, PolicyFactory
from gpushare.resources import ACK_SCHEDULER_NAME, DEFAULT_MAX_PODS_PER_GPU, SCHEDULER_NAME

API_CONNECTIONS = BINDS_AT_ONCE + 6
"""Requests the extender has open against the API server at most: one per bind
running (its calls follow one another), the node and pod watches, the requeue
worker's patches and the three event workers' events (bind's, unserved-scheduler,
damaged records)."""


@dataclass(frozen=True)
class ExtenderConfig:
    """What gpushare-extender is told, written once: the defaults of its flags are these
    fields' (gpushare.extender.main builds the flags from them; tests/chart pins the
    chart's values to them), and a configuration that cannot work is refused here, on
    construction, with a ValueError naming the flag (`__post_init__`). Whether
    default_placement names a policy is the policy registry's to say (`PolicyChoice`)."""

    host: str = "0.0.0.0"
    """Address of the operational endpoints and the webhook."""
    port: int = 39999
    """Port of the scheduler verbs."""
    scheduler_address: str = "127.0.0.1"
    """Address of the scheduler verbs: loopback, where only the kube-scheduler beside
    the extender in its pod reaches them."""
    ops_port: int = 39998
    url_prefix: str = "/gpushare-scheduler"
    webhook_port: int = 9443
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    scheduler_name: str = SCHEDULER_NAME
    extra_scheduler_names: tuple[str, ...] = (ACK_SCHEDULER_NAME,)
    default_placement: str = DEFAULT_PLACEMENT
    max_pods_per_gpu: int = DEFAULT_MAX_PODS_PER_GPU
    dra_claims: bool = False
    """DRA mode: the mutating webhook rewrites pods asking for aliyun.com resources to a
    resource claim (docs/dra.md#acks-pods-unchanged)."""
    read_limits: ReadLimits = DEFAULT_READ_LIMITS

    def __post_init__(self) -> None:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("give both --tls-cert-file and --tls-key-file, or neither")
        if self.max_pods_per_gpu < 1:
            raise ValueError(f"--max-pods-per-gpu must be at least 1, got {self.max_pods_per_gpu}")
        ports = {"--port": self.port, "--ops-port": self.ops_port}
        if self.webhook_enabled:
            ports["--webhook-port"] = self.webhook_port
        if len(set(ports.values())) < len(ports):
            flags = " ".join(f"{flag}={port}" for flag, port in ports.items())
            raise ValueError(f"each listener needs its own port, got {flags}")
        check_scheduler_names(self.scheduler_name, self.extra_scheduler_names)

    @property
    def webhook_enabled(self) -> bool:
        return self.tls_cert_file is not None and self.tls_key_file is not None

    @property
    def scheduler_names(self) -> tuple[str, ...]:
        """Every schedulerName our scheduler serves, the one the webhook writes first."""
        return (self.scheduler_name, *self.extra_scheduler_names)

    def summary(self) -> str:
        webhook = (
            f"https://{_host(self.host)}:{self.webhook_port}/validate|mutate"
            if self.webhook_enabled
            else "webhook off (no --tls-cert-file/--tls-key-file)"
        )
        return (
            f"gpushare-extender {VERSION}: http://{_host(self.scheduler_address)}:{self.port}"
            f"{self.url_prefix}/filter|prioritize|prioritize-claims|bind|preempt, "
            f"http://{_host(self.host)}:{self.ops_port}/healthz|readyz|metrics|inspect, {webhook}, "
            f"schedulers {', '.join(self.scheduler_names)}, "
            f"default placement {self.default_placement}, "
            f"max {self.max_pods_per_gpu} pods per GPU"
            + (", ACK pods rewritten to DRA claims" if self.dra_claims else "")
        )


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


class ExtenderService:
    def __init__(
        self,
        cluster: Cluster,
        config: ExtenderConfig,
        policies: Mapping[str, PolicyFactory] | PolicyChoice = POLICIES,
        dra: DraCluster | None = None,
    ) -> None:
        """`policies`: the registry this extender makes its own policy objects from
        (what they learn stays in this extender), config.default_placement the default
        among them, checked here (ValueError); or that choice made already, as
        gpushare-extender makes it to refuse a bad --default-placement before it looks
        for the API server."""
        self.config = config
        self.cluster = cluster
        self.cache = SchedulerCache(
            policies
            if isinstance(policies, PolicyChoice)
            else PolicyChoice(policies, config.default_placement),
            config.max_pods_per_gpu,
            served_schedulers=config.scheduler_names,
        )
        self.metrics = ExtenderMetrics(self.cache)
        self.events = PodEventQueue(cluster, self.metrics.events_dropped)
        self.binder = Binder(cluster, self.cache, self.metrics, self.events.post)
        self.requeuer = Requeuer(cluster, self.cache, self.metrics)
        self.cache.on_capacity_freed = self.requeuer.wake
        self.unserved = UnservedReporter(cluster, self.cache, config.scheduler_names)
        self.cache.on_unserved = self.unserved.wake
        self.damaged = DamagedRecordReporter(cluster, self.cache.take_damaged)
        self.cache.on_damaged = self.damaged.wake
        if config.dra_claims and dra is None:
            raise ValueError("--dra-claims needs the resource.k8s.io API (a DraCluster)")
        self.extender = Extender(
            self.cache,
            self.binder,
            self.metrics,
            config.scheduler_names,
            config.summary(),
            ClaimTemplates(dra) if config.dra_claims and dra is not None else None,
        )
        self.node_watch = WatchCache(
            "nodes", cluster.list_nodes, cluster.watch_nodes, self.cache.node_sink()
        )
        self.pod_watch = WatchCache(
            "pods",
            cluster.list_pods,
            cluster.watch_pods,
            self.cache.pod_sink(),
            keep=interesting,
        )

    def start_watching(self) -> "ExtenderService":
        self.events.start()
        self.requeuer.start()
        self.unserved.start()
        self.damaged.start()
        self.node_watch.start()
        self.pod_watch.start()
        return self

    def wait_synced(self, timeout: float | None = 30.0) -> bool:
        return self.node_watch.synced.wait(timeout) and self.pod_watch.synced.wait(timeout)

    def stop_watching(self) -> None:
        self.node_watch.stop()
        self.pod_watch.stop()
        self.requeuer.stop()
        self.unserved.stop()
        self.damaged.stop()
        self.events.stop()  # last: what the binds queued is posted first, for a while

    def app(self) -> FastAPI:
        """The verbs and the operational endpoints together, for a process that serves
        them only to itself on loopback (the demo, tests)."""
        return extender_app(self.extender, self.config.url_prefix, self.config.read_limits)

    def scheduler_app(self) -> FastAPI:
        return scheduler_app(self.extender, self.config.url_prefix, self.config.read_limits)

    def ops_app(self) -> FastAPI:
        return ops_app(self.extender)

    def webhook_app(self) -> FastAPI:
        return webhook_app(self.extender, self.config.read_limits)
