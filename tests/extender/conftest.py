from collections.abc import Iterator

import pytest

from gpushare.cluster.memory import MemoryCluster
from gpushare.placement.policies import POLICIES
from tests.extender.harness import Scheduler


@pytest.fixture
def cluster() -> MemoryCluster:
    return MemoryCluster()


@pytest.fixture
def scheduler_for(cluster: MemoryCluster) -> Iterator:
    """Starts an extender over `cluster` once the test has set up its nodes."""
    started: list[Scheduler] = []

    def start(policies=POLICIES, **config) -> Scheduler:
        """`policies`: the registry the extender makes its policies from."""
        from gpushare.extender.service import ExtenderConfig

        scheduler = Scheduler(cluster, ExtenderConfig(**config), policies)
        started.append(scheduler)
        return scheduler

    yield start
    for scheduler in started:
        scheduler.close()
