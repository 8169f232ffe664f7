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
import functools
import gc
import logging
import ssl
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

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
from gpushare.placement.policies import POLICIES

log = logging.getLogger("gpushare.extender")

_DEFAULTS = ExtenderConfig()
"""What the extender does without flags: each flag's default is its field's here."""


def _config_flag(parser: argparse.ArgumentParser, flag: str, help: str, **kwargs: Any) -> None:
    """The flag of ExtenderConfig's field of the same name (--ops-port: ops_port), its
    default the field's (a tuple as the comma-separated text the flag takes); help says
    it with %(default)s."""
    default = getattr(_DEFAULTS, flag.removeprefix("--").replace("-", "_"))
    if isinstance(default, tuple):
        default = ",".join(default)
    elif isinstance(default, bool):
        kwargs.setdefault("action", "store_true")
    elif isinstance(default, int):
        kwargs.setdefault("type", int)
    parser.add_argument(flag, default=default, help=help, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare-extender",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    flag = functools.partial(_config_flag, parser)
    flag(
        "--scheduler-address",
        "address of the scheduler verbs <url-prefix>/filter|prioritize|bind|preempt (and "
        "prioritize-claims in DRA mode); they bind pods and fill the reservation table, so "
        "only the kube-scheduler in the extender's pod may reach them: keep loopback "
        "unless a NetworkPolicy or the host guards the address (default %(default)s)",
    )
    flag("--port", "port of the scheduler verbs (default %(default)s)")
    flag(
        "--url-prefix",
        "path before the verbs; must match urlPrefix in the scheduler configuration "
        "(default %(default)s)",
    )
    flag(
        "--host",
        "address of the operational endpoints and the webhook (default %(default)s)",
    )
    flag(
        "--ops-port",
        "port of /healthz, /readyz, /metrics, /version, /inspect, /inspect/NODE "
        "(default %(default)s)",
    )
    flag(
        "--webhook-port",
        "HTTPS port of the admission webhook (/validate, /mutate); served only when "
        "--tls-cert-file and --tls-key-file are given (default %(default)s)",
    )
    flag("--tls-cert-file", "PEM certificate of the webhook", type=Path)
    flag("--tls-key-file", "PEM private key of the webhook", type=Path)
    flag(
        "--scheduler-name",
        "schedulerName the mutating webhook gives GPU pods that kept the default "
        "scheduler (default %(default)s)",
    )
    flag(
        "--extra-scheduler-names",
        "comma-separated further schedulerNames the scheduler beside this extender "
        "serves (its other profiles); the webhook checks pods naming them like pods naming "
        "--scheduler-name and warns about GPU pods naming a scheduler that is neither ours "
        f"nor {DEFAULT_SCHEDULER}; empty for none (default %(default)s)",
    )
    flag(
        "--default-placement",
        "placement policy for nodes without the ack.node.gpu.placement label and pods "
        f"without gpushare.io/placement-policy; one of {', '.join(sorted(POLICIES))} "
        "(default %(default)s: fragmentation-aware, see docs/placement.md)",
    )
    flag("--max-pods-per-gpu", "most pods sharing one GPU (default %(default)s)")
    flag(
        "--dra-claims",
        "DRA mode: the mutating webhook rewrites pods that ask for aliyun.com/gpu-mem, "
        "gpu-core.percentage or gpu-count to one resource claim of DeviceClass "
        "gpu.gpushare.io (the same GPU memory and compute share), creating its "
        "ResourceClaimTemplate in the pod's namespace; see docs/dra.md",
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
    """The configuration the flags give; ValueError naming the flag that cannot work
    (ExtenderConfig's checks), InputFileError naming a TLS file that cannot be used.
    The default placement is the policy registry's to check (`PolicyChoice`)."""
    config = ExtenderConfig(
        host=args.host,
        port=args.port,
        scheduler_address=args.scheduler_address,
        ops_port=args.ops_port,
        url_prefix=args.url_prefix,
        webhook_port=args.webhook_port,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        scheduler_name=args.scheduler_name,
        extra_scheduler_names=_names(args.extra_scheduler_names),
        default_placement=args.default_placement,
        max_pods_per_gpu=args.max_pods_per_gpu,
        dra_claims=args.dra_claims,
    )
    if config.tls_cert_file is not None and config.tls_key_file is not None:
        check_tls_files(config.tls_cert_file, config.tls_key_file)
    return config


def _names(text: str) -> tuple[str, ...]:
    """The names of a comma-separated list, "" for none."""
    return tuple(name.strip() for name in text.split(",")) if text.strip() else ()


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
        placement = PolicyChoice(POLICIES, config.default_placement)  # before the API
        config = replace(config, default_placement=placement.default)  # as it is known
    except ValueError as err:
        raise UsageError(str(err)) from None
    from gpushare.kubecluster import KubeCluster

    cluster = KubeCluster.from_config(args.kubeconfig, connections=API_CONNECTIONS)
    service = ExtenderService(cluster, config, placement, dra=cluster)
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
