"""The stand-in for what the API server and the resourceclaim controller make of an
ACK pod in DRA mode: the rewritten pod, its claim from the template, linked."""

import re

import pytest

from gpushare.cluster.memory import MemoryCluster
from gpushare.dra.claims import POD_CLAIM
from gpushare.errors import PodRefused
from gpushare.request import requests_gpu
from gpushare.standins.claimcontroller import admit_ack_pod
from tests.builders import pod


def test_the_pod_is_stored_rewritten_and_its_claim_made_from_its_template():
    store = MemoryCluster()
    admitted = admit_ack_pod(store, pod("train", mem=4, core=30, namespace="ml"))
    assert admitted is not None
    stored = store.get_pod("ml", "train")
    assert stored == admitted.pod and not requests_gpu(stored)
    claim = store.get_resource_claim("ml", admitted.claim.metadata.name)
    assert re.fullmatch(r"train-gpushare-[0-9a-f]{5}", claim.metadata.name)
    [status] = stored.status.resource_claim_statuses
    assert (status.name, status.resource_claim_name) == (POD_CLAIM, claim.metadata.name)
    [request] = claim.spec.devices.requests
    assert request.exactly.capacity.requests == {"memory": "4Gi", "cores": "30"}
    assert claim.status.allocation is None  # kube-scheduler's to allocate
    assert [r.name for r in admitted.request.containers] == ["main"]
    assert stored.claim_users(claim.metadata.name, "main") == ["main"]


def test_a_fixed_suffix_names_the_claim_the_same_every_run():
    admitted = admit_ack_pod(MemoryCluster(), pod("demo", mem=2), claim_suffix="")
    assert admitted is not None and admitted.claim.metadata.name == "demo-gpushare"


def test_a_pod_without_gpus_gets_no_claim_and_one_breaking_a_rule_is_refused():
    store = MemoryCluster()
    assert admit_ack_pod(store, pod("web")) is None
    with pytest.raises(PodRefused, match="multiple of 5"):
        admit_ack_pod(store, pod("bad", mem=4, core=7))
    assert store.list_pods().items == [] and store.list_resource_claims() == []
