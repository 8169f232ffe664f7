"""The schedulerName values gpushare's scheduler serves, and what to tell about a pod
that asks for our resources under a name nobody serves.

Such a pod is admitted, but only a scheduler of that name would ever look at it: it
stays Pending with no event at all. The webhook warns whoever creates it (for a Job
or a Deployment that is the controller, not the user), and the extender posts an
event on the pod itself (extender.unserved)."""

import re
from collections.abc import Sequence
from typing import Final

from gpushare.objects import Pod
from gpushare.request import requests_gpu

DEFAULT_SCHEDULER: Final = "default-scheduler"
"""The default scheduler's name: the mutating webhook sends GPU pods naming it to ours."""


def unserved_scheduler(pod: Pod, served: Sequence[str]) -> str | None:
    """The schedulerName of a pod asking for our resources under a name that is
    neither one of `served` (every name our scheduler serves) nor the default
    scheduler's; None for every other pod. Cheapest test first: the watch calls it
    on every pod change."""
    name = pod.spec.scheduler_name or DEFAULT_SCHEDULER
    if name == DEFAULT_SCHEDULER or name in served or not requests_gpu(pod):
        return None
    return name


def unserved_warning(name: str, served: Sequence[str]) -> str:
    """What the webhook warns (kubectl prints it); near the 120 characters the API
    asks warnings to stay under."""
    return (
        f'schedulerName "{name}" is not gpushare\'s ({", ".join(served)}); '
        "Pending unless such a scheduler runs"
    )


# What the API server accepts in a pod's spec.schedulerName: a DNS-1123 subdomain.
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_scheduler_names(main_name: str, extra: Sequence[str]) -> None:
    """Raises ValueError naming the flag unless the names are what kube-scheduler and the
    API server need: names a pod can carry, each served by one profile only."""
    seen: set[str] = set()
    for flag, name in [("--scheduler-name", main_name)] + [
        ("--extra-scheduler-names", name) for name in extra
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
