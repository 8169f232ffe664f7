"""gpushare-extender: the scheduler extender and admission webhook of gpushare.

Serves kube-scheduler's extender calls (filter, prioritize, bind, preempt) for a
scheduler profile that lists it in its KubeSchedulerConfiguration (see
config/kube-scheduler-config.yaml), and, given a TLS certificate, the admission
webhook that refuses pods breaking gpushare's rules and sends GPU pods to that
scheduler. Its state is the API's pods and nodes, watched; on start it is
rebuilt from the pods' allocation annotations alone.

Three listeners: the verbs on --scheduler-address (loopback: only the
kube-scheduler in the same pod calls them), the operational endpoints on
--host:--ops-port, the webhook on --host:--webhook-port (TLS). Every request is
bounded in size and time (docs/install.md, "Security").
"""

import argparse
import gc
import logging
import re
import ssl
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from gpushare.commandline import (
    InputFileError,
    UsageError,
    add_version_flag,
    exit_status,
    read_text,
)
from gpushare.extender.policychoice import PolicyChoice
from gpushare.extender.schedulernames import DEFAULT_SCHEDULER
from gpushare.extender.server import HttpServer
from gpushare.extender.service import API_CONNECTIONS, ExtenderConfig, ExtenderService
from gpushare.placement.policies import DEFAULT_PLACEMENT, POLICIES
from gpushare.resources import ACK_SCHEDULER_NAME, DEFAULT_MAX_PODS_PER_GPU, SCHEDULER_NAME

log = logging.getLogger("gpushare.extender")

# What the API server accepts in a pod's spec.schedulerName: a DNS-1123 subdomain.
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare-extender",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--scheduler-address",
        default="127.0.0.1",
        help="address of the scheduler verbs <url-prefix>/filter|prioritize|bind|preempt; "
        "they bind pods and fill the reservation table, so only the kube-scheduler in the "
        "extender's pod may reach them: keep loopback unless a NetworkPolicy or the host "
        "guards the address (default 127.0.0.1)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=39999,
        help="port of the scheduler verbs (default 39999)",
    )
    parser.add_argument(
        "--url-prefix",
        default="/gpushare-scheduler",
        help="path before the verbs; must match urlPrefix in the scheduler configuration "
        "(default /gpushare-scheduler)",
    )
    parser.add_argument(
        "--host",
        default="0.0.0.0",
        help="address of the operational endpoints and the webhook (default 0.0.0.0)",
    )
    parser.add_argument(
        "--ops-port",
        type=int,
        default=39998,
        help="port of /healthz, /readyz, /metrics, /version, /inspect, /inspect/NODE "
        "(default 39998)",
    )
    parser.add_argument(
        "--webhook-port",
        type=int,
        default=9443,
        help="HTTPS port of the admission webhook (/validate, /mutate); served only when "
        "--tls-cert-file and --tls-key-file are given (default 9443)",
    )
    parser.add_argument("--tls-cert-file", type=Path, help="PEM certificate of the webhook")
    parser.add_argument("--tls-key-file", type=Path, help="PEM private key of the webhook")
    parser.add_argument(
        "--scheduler-name",
        default=SCHEDULER_NAME,
        help="schedulerName the mutating webhook gives GPU pods that kept the default "
        f"scheduler (default {SCHEDULER_NAME})",
    )
    parser.add_argument(
        "--extra-scheduler-names",
        default=ACK_SCHEDULER_NAME,
        help="comma-separated further schedulerNames the scheduler beside this extender "
        "serves (its other profiles); the webhook checks pods naming them like pods naming "
        "--scheduler-name and warns about GPU pods naming a scheduler that is neither ours "
        f"nor {DEFAULT_SCHEDULER}; empty for none (default {ACK_SCHEDULER_NAME})",
    )
    parser.add_argument(
        "--default-placement",
        default=DEFAULT_PLACEMENT,
        help="placement policy for nodes without the ack.node.gpu.placement label and pods "
        f"without gpushare.io/placement-policy; one of {', '.join(sorted(POLICIES))} "
        f"(default {DEFAULT_PLACEMENT}: fragmentation-aware, see docs/placement.md)",
    )
    parser.add_argument(
        "--max-pods-per-gpu",
        type=int,
        default=DEFAULT_MAX_PODS_PER_GPU,
        help=f"most pods sharing one GPU (default {DEFAULT_MAX_PODS_PER_GPU})",
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the "
        "in-cluster service account)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default info)",
    )
    add_version_flag(parser)
    return parser


def config_from(args: argparse.Namespace) -> ExtenderConfig:
    """The configuration the flags give; ValueError naming the flag that cannot work,
    InputFileError naming a TLS file that cannot be used."""
    if (args.tls_cert_file is None) != (args.tls_key_file is None):
        raise ValueError("give both --tls-cert-file and --tls-key-file, or neither")
    if args.tls_cert_file is not None:
        check_tls_files(args.tls_cert_file, args.tls_key_file)
    if args.max_pods_per_gpu < 1:
        raise ValueError(f"--max-pods-per-gpu must be at least 1, got {args.max_pods_per_gpu}")
    ports = {"--port": args.port, "--ops-port": args.ops_port}
    if args.tls_cert_file is not None:
        ports["--webhook-port"] = args.webhook_port
    if len(set(ports.values())) < len(ports):
        raise ValueError(f"each listener needs its own port, got {_flags(ports)}")
    extra_names = _extra_scheduler_names(args.scheduler_name, args.extra_scheduler_names)
    return ExtenderConfig(
        host=args.host,
        port=args.port,
        scheduler_address=args.scheduler_address,
        ops_port=args.ops_port,
        url_prefix=args.url_prefix,
        webhook_port=args.webhook_port,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        scheduler_name=args.scheduler_name,
        extra_scheduler_names=extra_names,
        default_placement=PolicyChoice(POLICIES, args.default_placement).default,
        max_pods_per_gpu=args.max_pods_per_gpu,
    )


def check_tls_files(cert: Path, key: Path) -> None:
    """Loads the pair as the webhook's server will: a file that is not a PEM certificate
    and its key is said now, not in the webhook's thread once the verbs are serving."""
    read_text(cert, "--tls-cert-file")
    read_text(key, "--tls-key-file")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as err:
        raise InputFileError(
            "--tls-cert-file",
            cert,
            f"with --tls-key-file {key}, not a PEM certificate and its private key "
            f"({err.reason or err})",
        ) from None


def _flags(values: dict[str, int]) -> str:
    return " ".join(f"{flag}={value}" for flag, value in values.items())


def _extra_scheduler_names(main_name: str, extra: str) -> tuple[str, ...]:
    """The extra names, checked as kube-scheduler and the API server would need them:
    names a pod can carry, each served by one profile only."""
    names = [name.strip() for name in extra.split(",")] if extra.strip() else []
    seen: set[str] = set()
    for flag, name in [("--scheduler-name", main_name)] + [
        ("--extra-scheduler-names", name) for name in names
    ]:
        if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
            raise ValueError(
                f"{flag}: {name!r} is not a scheduler name a pod can carry (a DNS-1123 "
                "subdomain: lower-case letters, digits, '-' and '.', at most 253 characters)"
            )
        if name == DEFAULT_SCHEDULER:
            raise ValueError(f"{flag}: {DEFAULT_SCHEDULER} is the default scheduler's name")
        if name in seen:
            raise ValueError(
                f"{flag}: {name} is named twice across --scheduler-name and "
                "--extra-scheduler-names (each is one profile of kube-scheduler)"
            )
        seen.add(name)
    return tuple(names)


def _report_sync(service: ExtenderService) -> None:
    service.wait_synced(timeout=None)
    # Everything listed at start lives as long as the process: keep it out of the
    # collector's full passes, which would otherwise stall requests on big clusters.
    gc.freeze()
    counts = service.cache.counts()
    log.info(
        "synced: %d nodes, %d pods with GPU requests or allocations; ready",
        counts.nodes,
        counts.pods,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return exit_status(parser, lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """Serves until kube-scheduler's verbs stop (SIGTERM)."""
    try:
        config = config_from(args)
    except ValueError as err:
        raise UsageError(str(err)) from None
    from gpushare.kubecluster import KubeCluster

    cluster = KubeCluster.from_config(args.kubeconfig, connections=API_CONNECTIONS)
    service = ExtenderService(cluster, config)
    log.info("%s, API server from %s", config.summary(), cluster.origin)
    service.start_watching()
    threading.Thread(target=_report_sync, args=(service,), name="sync", daemon=True).start()
    limits = config.read_limits
    background = [
        HttpServer(
            service.ops_app(), config.host, config.ops_port, log_level=args.log_level, limits=limits
        )
    ]
    if config.webhook_enabled:
        background.append(
            HttpServer(
                service.webhook_app(),
                config.host,
                config.webhook_port,
                config.tls_cert_file,
                config.tls_key_file,
                log_level=args.log_level,
                limits=limits,
            )
        )
    for server in background:
        server.start()
    # uvicorn handles SIGTERM/SIGINT: it drains requests, then re-raises the signal.
    # The verbs on asyncio's own loop, not uvloop: its socket writes release the GIL.
    # uvloop sends while holding it, and each send wakes kube-scheduler, which on a busy
    # machine may take this thread's CPU there and then: every other thread of the
    # extender then waits, GIL-less, through kube-scheduler's serial scheduling cycle.
    HttpServer(
        service.scheduler_app(),
        config.scheduler_address,
        config.port,
        log_level=args.log_level,
        limits=limits,
        loop="asyncio",
    ).run()
    for server in background:
        server.stop()
    service.stop_watching()
    return 0


if __name__ == "__main__":
    sys.exit(main())
