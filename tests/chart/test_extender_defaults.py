"""The chart runs the extender as the extender runs without flags: values.yaml, the flags
the chart renders, both scheduler configurations (the chart's and the standalone
config/kube-scheduler-config.yaml) and the placement policies NOTES.txt offers are the
extender's own (ExtenderConfig, POLICIES). A default changed on one side only fails here."""

import re

import pytest
import yaml

from gpushare.extender.main import build_parser
from gpushare.extender.service import ExtenderConfig
from gpushare.placement.policies import POLICIES
from tests.chart.rendering import CHART, Rendered, container, flags, render, scheduler_config

DEFAULTS = ExtenderConfig()
STANDALONE = CHART.parents[1] / "config" / "kube-scheduler-config.yaml"


@pytest.fixture(scope="module")
def default() -> Rendered:
    return render()


def test_the_values_are_the_extenders_defaults():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    extender, scheduler = values["extender"], values["scheduler"]
    assert {
        "extender.port": extender["port"],
        "extender.opsPort": extender["opsPort"],
        "extender.urlPrefix": extender["urlPrefix"],
        "webhook.port": values["webhook"]["port"],
        "extender.defaultPlacement": extender["defaultPlacement"],
        "extender.maxPodsPerGpu": extender["maxPodsPerGpu"],
        "scheduler.name": scheduler["name"],
        "scheduler.extraSchedulerNames": tuple(scheduler["extraSchedulerNames"]),
    } == {
        "extender.port": DEFAULTS.port,
        "extender.opsPort": DEFAULTS.ops_port,
        "extender.urlPrefix": DEFAULTS.url_prefix,
        "webhook.port": DEFAULTS.webhook_port,
        "extender.defaultPlacement": DEFAULTS.default_placement,
        "extender.maxPodsPerGpu": DEFAULTS.max_pods_per_gpu,
        "scheduler.name": DEFAULTS.scheduler_name,
        "scheduler.extraSchedulerNames": DEFAULTS.extra_scheduler_names,
    }


def test_the_chart_passes_the_extender_its_defaults_but_the_webhooks_certificate(default):
    spec = default.one("Deployment")["spec"]["template"]["spec"]
    given = vars(build_parser().parse_args(
        [f"{flag}={value}" for flag, value in flags(container(spec, "extender")).items()]
    ))  # fmt: skip
    unflagged = vars(build_parser().parse_args([]))
    certificate = {"tls_cert_file", "tls_key_file"}
    assert {k: v for k, v in given.items() if k not in certificate} == {
        k: v for k, v in unflagged.items() if k not in certificate
    }


def test_both_scheduler_configurations_call_the_verbs_where_the_extender_serves_them(default):
    verbs = f"http://{DEFAULTS.scheduler_address}:{DEFAULTS.port}{DEFAULTS.url_prefix}"
    [charts] = scheduler_config(default)["extenders"]
    [standalone] = yaml.safe_load(STANDALONE.read_text())["extenders"]
    assert charts["urlPrefix"] == verbs
    assert standalone["urlPrefix"] == verbs


def test_the_notes_offer_exactly_the_placement_policies_the_extender_knows(default):
    [offered] = re.findall(r"ack\.node\.gpu\.placement=(\S+)", default.notes)
    assert offered.split("|") == sorted(POLICIES)
