"""The DRA tier's kube-scheduler configuration, checked here because the tier itself
runs only where Kubernetes binaries are given: the chart's, adapted to the harness."""

from urllib.parse import urlsplit

import pytest

from gpushare.extender.metrics import Verb
from tests.e2e.local import EXTENDER_PORT
from tests.e2e.localdra import harness_scheduler_config


@pytest.mark.parametrize(("minor", "version"), [(34, "v1.34.2"), (36, "v1.36.0")])
def test_the_harness_runs_the_charts_dra_profiles_against_its_own_extender(minor, version):
    config = harness_scheduler_config(minor, version)
    names = [p["schedulerName"] for p in config["profiles"]]
    assert names[0] == "gpushare-scheduler" and names[-1] == "default-scheduler"
    verbs = [e.get("prioritizeVerb") for e in config["extenders"]]
    assert verbs == [Verb.PRIORITIZE, Verb.PRIORITIZE_CLAIMS]
    assert {urlsplit(e["urlPrefix"]).port for e in config["extenders"]} == {EXTENDER_PORT}
    assert config["clientConnection"] == {"kubeconfig": "__K__/kubeconfig"}
    assert config["leaderElection"] == {"leaderElect": False}
