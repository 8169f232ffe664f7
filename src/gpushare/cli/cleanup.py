"""`gpushare uninstall-cleanup`: removes what gpushare's components wrote into the
cluster while they ran, which `helm uninstall` cannot know about.

Helm deletes only the objects the chart rendered. The device plugin annotates each
GPU node with `gpushare.io/gpus` (at start and on every GPU health change, never at
shutdown); kube-scheduler holds a leader-election Lease; with cert-manager, the
webhook's certificate Secret outlives its Certificate; in DRA mode the driver's
ResourceSlices stay until the kubelet notices the driver gone. The chart's post-delete hook
runs this command to remove them. Every step is idempotent (a node without the
annotation, a Lease already gone), so the hook can run again. Pods are not touched:
running pods keep their GPUs until they end.
"""

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from gpushare.cluster import ClusterError, NotFound
from gpushare.inventory import NODE_GPUS_ANNOTATION

if TYPE_CHECKING:
    from gpushare.kubecluster import KubeCluster

PROG = "gpushare uninstall-cleanup"


@dataclass(frozen=True, slots=True)
class ObjectName:
    """A namespaced object, written NAMESPACE/NAME on the command line."""

    namespace: str
    name: str

    @classmethod
    def parse(cls, text: str) -> "ObjectName":
        namespace, _, name = text.partition("/")
        if not namespace or not name or "/" in name:
            raise argparse.ArgumentTypeError(f"expected NAMESPACE/NAME, got {text!r}")
        return cls(namespace, name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class Report:
    """What one run did: each entry names an object, each failure says why."""

    removed: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{len(self.removed)} removed, {len(self.absent)} already gone, "
            f"{len(self.failed)} failed"
        )


def register(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = commands.add_parser(
        "uninstall-cleanup",
        help="remove the node annotation and Leases gpushare left behind (helm post-delete)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--lease",
        action="append",
        default=[],
        type=ObjectName.parse,
        metavar="NAMESPACE/NAME",
        help="a leader-election Lease to delete; repeat for each",
    )
    parser.add_argument(
        "--secret",
        action="append",
        default=[],
        type=ObjectName.parse,
        metavar="NAMESPACE/NAME",
        help="a Secret to delete (the webhook certificate cert-manager leaves); repeat for each",
    )
    parser.add_argument(
        "--resource-slice-driver",
        action="append",
        default=[],
        metavar="DRIVER",
        help="delete every ResourceSlice of this DRA driver (DRA mode: gpu.gpushare.io); "
        "repeat for each",
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)",
    )
    parser.set_defaults(run=run)


def clean(
    cluster: "KubeCluster",
    leases: Sequence[ObjectName],
    secrets: Sequence[ObjectName] = (),
    say: Callable[[str], None] = print,
    slice_drivers: Sequence[str] = (),
) -> Report:
    """Removes the annotation from every node that has it, then the Leases, Secrets
    and the DRA drivers' ResourceSlices; goes on past a failure so that one run removes
    all it may."""
    report = Report()
    try:
        nodes = cluster.list_nodes().items
    except ClusterError as err:
        report.failed.append(str(err))
        nodes = []
    for node in nodes:
        if NODE_GPUS_ANNOTATION in node.metadata.annotations:
            _remove(
                report,
                say,
                f"{NODE_GPUS_ANNOTATION} from node {node.name}",
                partial(cluster.patch_node_annotations, node.name, {NODE_GPUS_ANNOTATION: None}),
                failure_prefix=f"remove {NODE_GPUS_ANNOTATION}: ",
            )
    for lease in leases:
        _remove(
            report,
            say,
            f"lease {lease}",
            partial(cluster.delete_lease, lease.namespace, lease.name),
        )
    for secret in secrets:
        _remove(
            report,
            say,
            f"secret {secret}",
            partial(cluster.delete_secret, secret.namespace, secret.name),
        )
    for driver in slice_drivers:
        try:
            slices = cluster.list_resource_slices(driver=driver)
        except ClusterError as err:
            report.failed.append(f"list the ResourceSlices of {driver}: {err}")
            continue
        for found in slices:
            _remove(
                report,
                say,
                f"ResourceSlice {found.metadata.name} of {driver}",
                partial(cluster.delete_resource_slice, found.metadata.name),
            )
    return report


def _remove(
    report: Report,
    say: Callable[[str], None],
    what: str,
    action: Callable[[], object],
    failure_prefix: str = "",
) -> None:
    """Runs `action`, which removes `what`; NotFound means someone was first. The
    adapter's errors name the verb and the object ("delete lease ns/name: ..."), the
    prefix says what a patch was for."""
    try:
        action()
    except NotFound:
        report.absent.append(what)
        say(f"already gone: {what}")
    except ClusterError as err:
        report.failed.append(f"{failure_prefix}{err}")
    else:
        report.removed.append(what)
        say(f"removed {what}")


def run(args: argparse.Namespace) -> int:
    from gpushare.kubecluster import KubeCluster  # the Kubernetes adapter: only this command

    cluster = KubeCluster.from_config(args.kubeconfig)  # ConfigException: gpushare main says it
    leases = ", ".join(map(str, args.lease)) or "none"
    secrets = ", ".join(map(str, args.secret)) or "none"
    drivers = ", ".join(args.resource_slice_driver) or "none"
    print(
        f"{PROG}: removing {NODE_GPUS_ANNOTATION} from every node, Leases {leases}, "
        f"Secrets {secrets}, the ResourceSlices of {drivers} (API from {cluster.origin})",
        flush=True,
    )
    report = clean(
        cluster,
        args.lease,
        args.secret,
        say=lambda line: print(line, flush=True),
        slice_drivers=args.resource_slice_driver,
    )
    for failure in report.failed:
        print(f"{PROG}: failed: {failure}", file=sys.stderr)
    print(f"{PROG}: {report.summary()}")
    return 1 if report.failed else 0
