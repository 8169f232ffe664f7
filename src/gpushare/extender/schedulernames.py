"""The schedulerName values gpushare's scheduler serves, and what to tell about a pod
that asks for our resources under a name nobody serves.

Such a pod is admitted, but only a scheduler of that name would ever look at it: it
stays Pending with no event at all. The webhook warns whoever creates it (for a Job
or a Deployment that is the controller, not the user), and the extender posts an
event on the pod itself (extender.unserved)."""

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
