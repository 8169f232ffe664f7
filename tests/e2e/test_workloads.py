"""The e2e suite's rewriting of examples/ (runs everywhere, no cluster needed)."""

import yaml

from gpushare.manifests import pods_from_manifests
from gpushare.request import parse_pod_request
from tests.e2e.workloads import (
    IMAGE,
    invalid_examples,
    manifests,
    unnamed_scheduler_pod,
    valid_examples,
)


def test_examples_keep_their_gpu_requests_and_only_change_what_runs():
    assert len(valid_examples()) >= 5 and invalid_examples()
    for path in valid_examples():
        original = pods_from_manifests(yaml.safe_load_all(path.read_text()))
        rewritten = pods_from_manifests(manifests(path))
        assert [parse_pod_request(p) for p in rewritten] == [parse_pod_request(p) for p in original]
        for before, after in zip(original, rewritten, strict=True):
            assert after.spec.scheduler_name == before.spec.scheduler_name
            assert after.metadata.labels.items() >= before.metadata.labels.items()
            assert after.metadata.labels["gpushare-e2e"] == "true"
            for c in (*after.spec.containers, *after.spec.init_containers):
                assert c.image == IMAGE


def test_rewritten_commands_print_the_environment():
    [doc] = manifests(valid_examples()[0])
    spec = doc["spec"]["template"]["spec"] if "template" in doc["spec"] else doc["spec"]
    command = spec["containers"][0]["command"]
    assert command[:2] == ["sh", "-c"] and "env" in command[2] and "sleep" in command[2]


def test_the_webhook_pod_names_no_scheduler():
    pod = unnamed_scheduler_pod()
    assert "schedulerName" not in pod["spec"]
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"aliyun.com/gpu-mem": 1}
