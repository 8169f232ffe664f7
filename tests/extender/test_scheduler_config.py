"""config/kube-scheduler-config.yaml obeys every rule of
docs/contracts.md#scheduler-configuration, with the strictness kube-scheduler
decodes it with, and points at the extender's defaults."""

import re
from pathlib import Path

import pytest
import yaml

from gpushare.extender.main import build_parser, config_from
from gpushare.resources import ACK_SCHEDULER_NAME, MANAGED_RESOURCES, SCHEDULER_NAME

CONFIG = Path(__file__).resolve().parents[2] / "config" / "kube-scheduler-config.yaml"

TOP_KEYS = {
    "apiVersion",
    "kind",
    "leaderElection",
    "profiles",
    "percentageOfNodesToScore",
    "extenders",
    "clientConnection",
    "parallelism",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "debuggingConfiguration",
    "healthzBindAddress",
    "metricsBindAddress",
    "featureGates",
    "delayCacheUntilActive",
}
LEADER_KEYS = {
    "leaderElect",
    "resourceNamespace",
    "resourceName",
    "resourceLock",
    "leaseDuration",
    "renewDeadline",
    "retryPeriod",
}
PROFILE_KEYS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
EXTENDER_KEYS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
MANAGED_KEYS = {"name", "ignoredByScheduler"}
EXTENDED_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def unknown(keys, allowed) -> set:
    return set(keys) - allowed


def test_every_key_is_one_kube_scheduler_knows(config):
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert not unknown(config, TOP_KEYS)
    assert not unknown(config["leaderElection"], LEADER_KEYS)
    for profile in config["profiles"]:
        assert not unknown(profile, PROFILE_KEYS)
    for extender in config["extenders"]:
        assert not unknown(extender, EXTENDER_KEYS)
        for resource in extender.get("managedResources", []):
            assert not unknown(resource, MANAGED_KEYS)


def test_it_is_a_second_scheduler_with_its_own_lease(config):
    assert config["profiles"][0]["schedulerName"] == SCHEDULER_NAME
    election = config["leaderElection"]
    assert election["leaderElect"] is True
    assert election["resourceName"] not in ("", "kube-scheduler")
    assert config["percentageOfNodesToScore"] == 100


def test_it_serves_ack_co_scheduler_as_the_extender_expects_by_default(config):
    names = [p["schedulerName"] for p in config["profiles"]]
    assert names == [SCHEDULER_NAME, ACK_SCHEDULER_NAME]
    assert config_from(build_parser().parse_args([])).scheduler_names == tuple(names)


def test_profiles_are_unique_and_alike_as_kube_scheduler_requires(config):
    """kube-scheduler refuses a name twice and profiles with different queueSort; and
    each of our names must place pods as the first does (the extender is global)."""
    names = [p["schedulerName"] for p in config["profiles"]]
    assert all(names) and len(names) == len(set(names))
    first, *others = [
        {k: v for k, v in p.items() if k != "schedulerName"} for p in config["profiles"]
    ]
    assert all(other == first for other in others)


def test_the_extender_stanza_is_valid_and_matches_the_extender(config):
    (extender,) = config["extenders"]
    defaults = build_parser().parse_args([])
    assert extender["urlPrefix"] == f"http://127.0.0.1:{defaults.port}{defaults.url_prefix}"
    verbs = {k: extender[k] for k in ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb")}
    assert verbs == {
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "preemptVerb": "preempt",
        "bindVerb": "bind",
    }
    assert isinstance(extender["weight"], int) and extender["weight"] >= 20
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False
    assert re.fullmatch(r"\d+(ms|s|m)", extender["httpTimeout"])
    assert int(extender["httpTimeout"].rstrip("s")) >= 5


def test_managed_resources_cover_ours_once_and_stay_counted(config):
    names = [r["name"] for e in config["extenders"] for r in e["managedResources"]]
    assert sorted(names) == sorted(MANAGED_RESOURCES)
    assert len(names) == len(set(names))  # no name twice across extenders
    for name in names:
        assert EXTENDED_NAME.match(name) and not name.startswith("kubernetes.io/")
        assert len(name.split("/", 1)[1]) <= 63
    for extender in config["extenders"]:
        assert all(r["ignoredByScheduler"] is False for r in extender["managedResources"])


def test_only_one_extender_binds(config):
    assert sum(1 for e in config["extenders"] if e.get("bindVerb")) == 1
