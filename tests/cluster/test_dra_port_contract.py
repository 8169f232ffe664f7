"""The DRA half of the cluster port's contract (gpushare.cluster.DraCluster), run over
both adapters: `MemoryCluster`, and `KubeCluster` speaking HTTP with the official
client to the fake API server on loopback (tests/kubecluster/draroutes.py).

Each test writes through the port or through the store behind it (what other clients
of the API server do) and checks what the port makes of it. The API server's rules
themselves are tested in tests/dra/.
"""

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest
from kubernetes import client

from gpushare.cluster import Conflict, DraCluster, Invalid, NotFound
from gpushare.cluster.memory import MemoryCluster
from gpushare.dra.objects import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimStatus,
    ResourceClaimTemplate,
    ResourceSlice,
)
from gpushare.dra.validation import ApiGates, ApiRelease, FieldError
from gpushare.kubecluster import KubeCluster
from tests.dra.builders import DRIVER, GONE, at, changed, claim_doc, result, slice_doc
from tests.kubecluster.apiserver import ApiServer


@dataclass
class Adapter:
    port: DraCluster
    """What the components are handed."""
    store: MemoryCluster
    """The state behind it, written as other API clients would."""


def _memory(store: MemoryCluster, stack: ExitStack) -> Adapter:
    return Adapter(store, store)


def _kube(store: MemoryCluster, stack: ExitStack) -> Adapter:
    api = ApiServer(store)
    stack.callback(api.close)
    configuration = client.Configuration()
    configuration.host = api.url
    return Adapter(KubeCluster(client.ApiClient(configuration)), store)


@pytest.fixture(params=[_memory, _kube], ids=["MemoryCluster", "KubeCluster"])
def adapter_over(request: pytest.FixtureRequest) -> Iterator[Callable[[ApiGates], Adapter]]:
    """The adapter over a fresh store whose API server has these gates."""
    with ExitStack() as stack:
        yield lambda gates: request.param(MemoryCluster(dra_gates=gates), stack)


@pytest.fixture
def cluster(adapter_over) -> Adapter:
    return adapter_over(ApiGates.of())


def a_slice(node: str = "n1", driver: str = DRIVER, **meta) -> ResourceSlice:
    doc = slice_doc(node=node, driver=driver)
    doc["metadata"] = meta or {"generateName": f"{node}-{driver}-"}
    return ResourceSlice.model_validate(doc)


def a_claim(name: str = "c", namespace: str = "team") -> ResourceClaim:
    return ResourceClaim.model_validate(claim_doc(name, namespace))


def with_status(claim: ResourceClaim, **status) -> ResourceClaim:
    return claim.model_copy(update={"status": ResourceClaimStatus.model_validate(status)})


# ----- ResourceSlice


def test_a_slice_created_with_generate_name_gets_a_name_uid_and_version(cluster):
    made = cluster.port.create_resource_slice(a_slice("n1"))
    name = made.metadata.name
    assert name.startswith("n1-gpu.gpushare.io-") and len(name) == len("n1-gpu.gpushare.io-") + 5
    assert made.metadata.uid and int(made.metadata.resource_version) > 0
    assert cluster.store.get_resource_slice(name) == made
    assert cluster.port.get_resource_slice(name) == made
    assert made.spec == a_slice("n1").spec
    again = cluster.port.create_resource_slice(a_slice("n1"))
    assert again.metadata.name != name and again.metadata.uid != made.metadata.uid


def test_a_slice_of_a_name_taken_is_a_conflict(cluster):
    cluster.port.create_resource_slice(a_slice(name="fixed"))
    with pytest.raises(Conflict, match="already exists"):
        cluster.port.create_resource_slice(a_slice(name="fixed"))


def test_slices_are_listed_by_driver_and_node_in_name_order(cluster):
    for name, node, driver in [
        ("d", "n1", DRIVER),
        ("a", "n2", DRIVER),
        ("c", "n1", "other.example.com"),
        ("b", "n1", DRIVER),
    ]:
        cluster.store.create_resource_slice(a_slice(node, driver, name=name))

    def names(**selected) -> list[str]:
        return [s.metadata.name for s in cluster.port.list_resource_slices(**selected)]

    assert names() == ["a", "b", "c", "d"]
    assert names(driver=DRIVER) == ["a", "b", "d"]
    assert names(node_name="n1") == ["b", "c", "d"]
    assert names(driver=DRIVER, node_name="n1") == ["b", "d"]
    assert names(driver="nobody.example.com") == []


def test_an_update_replaces_the_slice_and_one_from_a_stale_read_conflicts(cluster):
    read = cluster.port.create_resource_slice(a_slice(name="s"))
    bumped = changed(read.to_api(), at("spec.pool.generation", 1))
    written = cluster.port.update_resource_slice(ResourceSlice.model_validate(bumped))
    assert written.spec.pool.generation == 1
    assert int(written.metadata.resource_version) > int(read.metadata.resource_version)
    assert written.metadata.uid == read.metadata.uid
    stale = changed(read.to_api(), at("spec.pool.generation", 2))
    with pytest.raises(Conflict, match="modified"):
        cluster.port.update_resource_slice(ResourceSlice.model_validate(stale))
    assert cluster.store.get_resource_slice("s").spec.pool.generation == 1


def test_an_update_without_a_version_is_unconditional(cluster):
    cluster.port.create_resource_slice(a_slice(name="s"))
    cluster.store.update_resource_slice(
        ResourceSlice.model_validate(changed(slice_doc(name="s"), at("spec.pool.generation", 1)))
    )
    blind = changed(slice_doc(name="s"), at("spec.pool.generation", 5))
    assert (
        cluster.port.update_resource_slice(ResourceSlice.model_validate(blind)).spec.pool.generation
        == 5
    )


def test_an_invalid_slice_comes_back_naming_the_field(cluster):
    broken = changed(slice_doc(name="s"), at("spec.devices.0.allowMultipleAllocations", GONE))
    with pytest.raises(Invalid) as refused:
        cluster.port.create_resource_slice(ResourceSlice.model_validate(broken))
    memory = "spec.devices[0].capacity.memory.requestPolicy"
    assert refused.value.errors[0] == FieldError(
        memory, "only allowed when allowMultipleAllocations is true"
    )
    assert len(refused.value.errors) == 3
    assert str(refused.value).startswith(
        f'ResourceSlice "s" is invalid: {memory}: only allowed when allowMultipleAllocations '
        "is true; spec.devices[0].capacity.cores.requestPolicy: only allowed"
    )
    with pytest.raises(NotFound):
        cluster.store.get_resource_slice("s")


def test_a_slices_node_cannot_change(cluster):
    read = cluster.port.create_resource_slice(a_slice("n1", name="s"))
    moved = ResourceSlice.model_validate(changed(read.to_api(), at("spec.nodeName", "n2")))
    with pytest.raises(Invalid) as refused:
        cluster.port.update_resource_slice(moved)
    assert refused.value.errors == (FieldError("spec.nodeName", "field is immutable"),)


def test_a_generated_name_appears_in_the_refusal(cluster):
    broken = changed(slice_doc(), at("metadata", {"generateName": "n1-"}), at("spec.driver", ""))
    with pytest.raises(Invalid, match=r'ResourceSlice "n1-[a-z0-9]{5}" is invalid: spec.driver'):
        cluster.port.create_resource_slice(ResourceSlice.model_validate(broken))


def test_a_slice_without_name_or_generate_name_is_invalid(cluster):
    nameless = ResourceSlice.model_validate(changed(slice_doc(), at("metadata", {})))
    with pytest.raises(Invalid) as refused:
        cluster.port.create_resource_slice(nameless)
    assert [e.path for e in refused.value.errors] == ["metadata.name"]


def test_deleted_slices_are_gone_and_deleting_a_missing_one_is_not_found(cluster):
    cluster.port.create_resource_slice(a_slice(name="s"))
    cluster.port.delete_resource_slice("s")
    with pytest.raises(NotFound, match='"s" not found'):
        cluster.port.get_resource_slice("s")
    with pytest.raises(NotFound):
        cluster.port.delete_resource_slice("s")
    with pytest.raises(NotFound):
        cluster.port.update_resource_slice(a_slice(name="s"))


def test_a_nodes_slices_are_deleted_together_and_no_other(cluster):
    for name, node, driver in [
        ("a", "n1", DRIVER),
        ("b", "n1", "other.example.com"),
        ("c", "n2", DRIVER),
        ("d", "n1", DRIVER),
    ]:
        cluster.store.create_resource_slice(a_slice(node, driver, name=name))
    cluster.port.delete_resource_slices("n1", driver=DRIVER)
    assert [s.metadata.name for s in cluster.store.list_resource_slices()] == ["b", "c"]
    cluster.port.delete_resource_slices("n1")
    assert [s.metadata.name for s in cluster.store.list_resource_slices()] == ["c"]


def test_a_read_modify_write_keeps_what_gpushare_does_not_know(cluster):
    doc = changed(
        slice_doc(name="s"),
        at("spec.devices.0.futureField", {"a": [1, 2]}),
        at("metadata.labels", {"k": "v"}),
    )
    cluster.store.create_resource_slice(ResourceSlice.model_validate(doc))
    read = cluster.port.get_resource_slice("s")
    written = cluster.port.update_resource_slice(
        ResourceSlice.model_validate(changed(read.to_api(), at("spec.pool.generation", 3)))
    )
    stored = cluster.store.get_resource_slice("s").to_api()
    assert stored["spec"]["devices"][0]["futureField"] == {"a": [1, 2]}
    assert stored["metadata"]["labels"] == {"k": "v"}
    assert written.to_api() == stored


def test_the_api_servers_release_drops_the_fields_of_its_gates_silently(adapter_over):
    old = adapter_over(ApiGates.of(ApiRelease.V1_34))
    made = old.port.create_resource_slice(a_slice(name="s"))
    device = made.spec.devices[0]
    assert device.allow_multiple_allocations is None
    assert all(c.request_policy is None for c in device.capacity.values())
    assert old.store.get_resource_slice("s") == made
    new = adapter_over(ApiGates.of(ApiRelease.V1_36))
    assert new.port.create_resource_slice(a_slice(name="s")).spec == a_slice().spec


# ----- ResourceClaim


def test_a_claim_is_created_in_its_namespace_with_defaults_and_no_status(cluster):
    allocated = with_status(a_claim("c", "team"), allocation={"devices": {"results": [result()]}})
    made = cluster.port.create_resource_claim(allocated)
    assert (made.metadata.namespace, made.metadata.name) == ("team", "c")
    assert made.metadata.uid and made.metadata.resource_version
    assert made.status == ResourceClaimStatus()
    exactly = made.spec.devices.requests[0].exactly
    assert (exactly.allocation_mode, exactly.count) == ("ExactCount", 1)
    assert cluster.port.get_resource_claim("team", "c") == made
    unplaced = a_claim("d").model_copy(
        update={"metadata": a_claim("d").metadata.model_copy(update={"namespace": None})}
    )
    assert cluster.port.create_resource_claim(unplaced).metadata.namespace == "default"


def test_missing_claims_are_not_found(cluster):
    with pytest.raises(NotFound):
        cluster.port.get_resource_claim("team", "ghost")
    cluster.port.create_resource_claim(a_claim("c", "team"))
    with pytest.raises(NotFound):
        cluster.port.get_resource_claim("other", "c")
    with pytest.raises(NotFound):
        cluster.port.delete_resource_claim("team", "ghost")


def test_a_claims_status_is_written_alone_and_only_on_the_version_read(cluster):
    read = cluster.port.create_resource_claim(a_claim())
    allocated = with_status(
        read,
        allocation={"devices": {"results": [result()]}},
        reservedFor=[{"resource": "pods", "name": "p", "uid": "pod-uid"}],
    )
    respecced = ResourceClaim.model_validate(
        changed(allocated.to_api(), at("spec.devices.requests.0.exactly.count", 2))
    )
    written = cluster.port.update_resource_claim_status(respecced)
    assert written.reserved_pod_uids() == {"pod-uid"}
    (mine,) = written.results_for(DRIVER)
    assert (mine.device, mine.share_id, mine.consumed_capacity["memory"]) == ("gpu-0", "s-1", "4Gi")
    assert written.spec == read.spec  # the /status subresource leaves the spec alone
    assert cluster.store.get_resource_claim("team", "c") == written
    with pytest.raises(Conflict):
        cluster.port.update_resource_claim_status(with_status(read))
    assert cluster.store.get_resource_claim("team", "c").reserved_pod_uids() == {"pod-uid"}


def test_an_invalid_status_is_refused_naming_the_field(cluster):
    read = cluster.port.create_resource_claim(a_claim())
    crowded = with_status(
        read,
        reservedFor=[{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(257)],
    )
    with pytest.raises(Invalid, match=r'ResourceClaim "c" is invalid: status.reservedFor: must'):
        cluster.port.update_resource_claim_status(crowded)
    assert cluster.store.get_resource_claim("team", "c").status.reserved_for == []


def test_a_claims_spec_is_immutable_but_its_metadata_is_not(cluster):
    read = cluster.port.create_resource_claim(a_claim())
    cluster.store.update_resource_claim_status(
        with_status(read, reservedFor=[{"resource": "pods", "name": "p", "uid": "u"}])
    )
    current = cluster.port.get_resource_claim("team", "c")
    more = changed(current.to_api(), at("spec.devices.requests.0.exactly.count", 2))
    with pytest.raises(Invalid) as refused:
        cluster.port.update_resource_claim(ResourceClaim.model_validate(more))
    assert refused.value.errors == (FieldError("spec", "field is immutable"),)
    labelled = changed(current.to_api(), at("metadata.labels", {"k": "v"}), at("status", {}))
    written = cluster.port.update_resource_claim(ResourceClaim.model_validate(labelled))
    assert written.metadata.labels == {"k": "v"}
    assert written.reserved_pod_uids() == {"u"}  # a plain update leaves the status alone


def test_claims_are_listed_by_namespace_and_deleted(cluster):
    for namespace, name in [("team", "b"), ("other", "a"), ("team", "a")]:
        cluster.store.create_resource_claim(a_claim(name, namespace))
    assert [c.key for c in cluster.port.list_resource_claims()] == ["other/a", "team/a", "team/b"]
    assert [c.key for c in cluster.port.list_resource_claims("team")] == ["team/a", "team/b"]
    cluster.port.delete_resource_claim("team", "a")
    assert [c.key for c in cluster.store.list_resource_claims()] == ["other/a", "team/b"]


def test_an_invalid_claim_is_refused_naming_the_field(cluster):
    broken = changed(claim_doc("c", "team"), at("spec.devices.requests.0.exactly.count", 0))
    with pytest.raises(Invalid) as refused:
        cluster.port.create_resource_claim(ResourceClaim.model_validate(broken))
    assert [e.path for e in refused.value.errors] == ["spec.devices.requests[0].exactly.count"]


# ----- ResourceClaimTemplate, DeviceClass


def test_templates_are_created_and_read(cluster):
    template = ResourceClaimTemplate.model_validate(
        {
            "metadata": {"name": "gpushare-0123456789", "namespace": "team"},
            "spec": {"metadata": {"labels": {"app": "x"}}, "spec": claim_doc()["spec"]},
        }
    )
    made = cluster.port.create_resource_claim_template(template)
    assert made.metadata.uid
    assert made.spec.spec.devices.requests[0].exactly.allocation_mode == "ExactCount"
    assert cluster.port.get_resource_claim_template("team", "gpushare-0123456789") == made
    assert made.spec.metadata.labels == {"app": "x"}
    with pytest.raises(Conflict):
        cluster.port.create_resource_claim_template(template)
    with pytest.raises(NotFound):
        cluster.port.get_resource_claim_template("other", "gpushare-0123456789")


def test_device_classes_are_created_and_listed(cluster):
    selector = {"cel": {"expression": 'device.driver == "gpu.gpushare.io"'}}
    for name in ("z.example.com", DRIVER):
        cluster.port.create_device_class(
            DeviceClass.model_validate(
                {"metadata": {"name": name}, "spec": {"selectors": [selector]}}
            )
        )
    listed = cluster.port.list_device_classes()
    assert [c.metadata.name for c in listed] == [DRIVER, "z.example.com"]
    assert listed[0].spec.selectors[0].cel.expression == selector["cel"]["expression"]
    bad = DeviceClass.model_validate(
        {"metadata": {"name": "bad"}, "spec": {"extendedResourceName": "gpu"}}
    )
    with pytest.raises(Invalid, match=r"spec\.extendedResourceName"):
        cluster.port.create_device_class(bad)
