"""The pods `gpushare demo` expects from the YAML a user applies."""

import pytest
import yaml

from gpushare.manifests import pods_from_manifests

JOB = """
apiVersion: batch/v1
kind: Job
metadata: {name: train, namespace: ml}
spec:
  parallelism: 3
  template:
    metadata: {labels: {app: train}, name: ignored}
    spec:
      containers:
      - name: main
        resources: {limits: {aliyun.com/gpu-mem: 4}}
"""


def pods(text: str):
    return pods_from_manifests(yaml.safe_load_all(text))


def test_a_job_makes_parallelism_pods_from_its_template_in_its_namespace():
    made = pods(JOB)
    assert [p.key for p in made] == ["ml/train-0", "ml/train-1", "ml/train-2"]
    assert all(p.metadata.labels == {"app": "train"} for p in made)
    assert all(p.spec.containers[0].resources.limits == {"aliyun.com/gpu-mem": "4"} for p in made)


@pytest.mark.parametrize("kind", ["Deployment", "ReplicaSet", "StatefulSet"])
def test_a_replicated_workload_makes_one_pod_per_replica(kind):
    made = pods(JOB.replace("kind: Job", f"kind: {kind}").replace("parallelism", "replicas"))
    assert [p.key for p in made] == ["ml/train-0", "ml/train-1", "ml/train-2"]


def test_a_job_with_parallelism_takes_it_over_replicas():
    made = pods(JOB.replace("  parallelism: 3", "  parallelism: 2\n  replicas: 5"))
    assert len(made) == 2


def test_a_workload_without_a_count_makes_one_pod_and_one_scaled_to_zero_none():
    assert len(pods(JOB.replace("  parallelism: 3\n", ""))) == 1
    assert pods(JOB.replace("parallelism: 3", "parallelism: 0")) == []
    assert len(pods(JOB.replace("parallelism: 3", "parallelism: null"))) == 1


def test_a_bare_workload_gets_kubernetes_defaults_not_a_crash():
    """No name, namespace, template or spec: still a pod, named and placed as kubectl
    would default it."""
    (made,) = pods("kind: Deployment\n")
    assert made.key == "default/pod-0"
    assert made.metadata.labels == {} and made.spec.containers == []
    (templated,) = pods("kind: Job\nspec: {template: {}}\n")
    assert templated.key == "default/pod-0" and templated.spec.containers == []


def test_pods_are_taken_as_they_are_and_other_objects_make_none():
    made = pods(
        """
kind: Pod
metadata: {name: solo, namespace: team}
spec: {containers: [{name: c}]}
---
kind: ConfigMap
metadata: {name: settings}
---
---
kind: Service
metadata: {name: web}
"""
    )
    assert [p.key for p in made] == ["team/solo"]
