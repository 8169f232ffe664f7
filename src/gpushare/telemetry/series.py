"""Labelled series that exist before their first event.

Prometheus's increase() and rate() start from a series' first sample: a counter born
at 1 by its first event shows no increase, so the first refusal, the first error, the
first rejection by a rule would go unseen. Every component creates the series of every
label value its code can emit, at 0, when it builds its metrics.
"""

import itertools
from collections.abc import Iterable

from prometheus_client.metrics import MetricWrapperBase


def at_zero(metric: MetricWrapperBase, *values: Iterable[str]) -> None:
    """Creates the series of every combination of label values (one iterable per label,
    in the metric's label order), at 0."""
    for combination in itertools.product(*values):
        metric.labels(*combination)
