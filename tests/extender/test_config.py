"""ExtenderConfig: the one place the extender's configuration is written and refused.
gpushare-extender's flags are built from it (tests/extender/test_main.py), the chart's
values are pinned to it (tests/chart/test_extender_defaults.py)."""

import re
from pathlib import Path

import pytest

from gpushare.cluster.memory import MemoryCluster
from gpushare.extender.policychoice import PolicyChoice
from gpushare.extender.service import ExtenderConfig, ExtenderService
from gpushare.placement.policies import POLICIES

TLS = {"tls_cert_file": Path("tls.crt"), "tls_key_file": Path("tls.key")}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_pods_per_gpu": 0}, "--max-pods-per-gpu must be at least 1, got 0"),
        ({"max_pods_per_gpu": -3}, "--max-pods-per-gpu must be at least 1, got -3"),
        ({"tls_cert_file": Path("tls.crt")}, "give both --tls-cert-file and --tls-key-file"),
        ({"tls_key_file": Path("tls.key")}, "give both --tls-cert-file and --tls-key-file"),
        (
            {"ops_port": 39999},
            "each listener needs its own port, got --port=39999 --ops-port=39999",
        ),
        (
            {"webhook_port": 39998, **TLS},
            "each listener needs its own port, got --port=39999 --ops-port=39998 "
            "--webhook-port=39998",
        ),
        ({"scheduler_name": "Gpu"}, "--scheduler-name: 'Gpu' is not a scheduler name"),
        (
            {"extra_scheduler_names": ("a", "default-scheduler")},
            "--extra-scheduler-names: default-scheduler is the default scheduler's name",
        ),
        ({"extra_scheduler_names": ("a", "a")}, "--extra-scheduler-names: a is named twice"),
    ],
)
def test_a_configuration_that_cannot_work_is_refused_naming_the_flag(fields, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        ExtenderConfig(**fields)


def test_the_webhook_port_is_free_to_be_any_while_the_webhook_is_off():
    assert not ExtenderConfig(webhook_port=39998).webhook_enabled
    assert ExtenderConfig(max_pods_per_gpu=1, **TLS).webhook_enabled


def test_the_extender_places_by_the_choice_it_is_given():
    """gpushare-extender checks --default-placement once, before it looks for the API
    server, and hands the choice over: the service takes it as it is."""
    registry = {**POLICIES, "custom": POLICIES["binpack"]}
    config = ExtenderConfig(default_placement="custom")
    with pytest.raises(ValueError, match="'custom' is not a placement policy"):
        ExtenderService(MemoryCluster(), config)  # made here, of POLICIES
    ExtenderService(MemoryCluster(), config, PolicyChoice(registry, "custom"))
