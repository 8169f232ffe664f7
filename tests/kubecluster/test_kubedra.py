"""KubeCluster's DRA half (kubecluster/dra.py) on the wire: the requests it sends to the
resource.k8s.io/v1 API and how it reads the answers it gets. What both adapters share
is in tests/cluster/test_dra_port_contract.py."""

from collections.abc import Iterator

import pytest
from kubernetes import client

from gpushare.cluster import ClusterError, Invalid
from gpushare.cluster.memory import MemoryCluster
from gpushare.dra.objects import ResourceSlice
from gpushare.dra.validation import FieldError
from gpushare.kubecluster import KubeCluster
from tests.dra.builders import DRIVER, at, changed, slice_doc
from tests.kubecluster.apiserver import ApiServer

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.fixture
def memory() -> MemoryCluster:
    return MemoryCluster()


@pytest.fixture
def api(memory: MemoryCluster) -> Iterator[ApiServer]:
    server = ApiServer(memory)
    yield server
    server.close()


@pytest.fixture
def kube(api: ApiServer) -> KubeCluster:
    configuration = client.Configuration()
    configuration.host = api.url
    return KubeCluster(client.ApiClient(configuration))


def a_slice(name: str = "s") -> ResourceSlice:
    return ResourceSlice.model_validate(slice_doc(name=name))


def test_slices_are_listed_with_field_selectors(api, kube):
    kube.list_resource_slices(driver=DRIVER, node_name="n1")
    kube.list_resource_slices(node_name="n2")
    kube.list_resource_slices()
    selectors = [r.query.get("fieldSelector") for r in api.seen("GET", SLICES)]
    assert selectors == [[f"spec.driver={DRIVER},spec.nodeName=n1"], ["spec.nodeName=n2"], None]


def test_a_nodes_slices_are_deleted_as_one_collection(api, kube):
    kube.delete_resource_slices("n1", driver=DRIVER)
    (request,) = api.seen("DELETE", SLICES)
    assert request.path == SLICES
    assert request.query["fieldSelector"] == [f"spec.nodeName=n1,spec.driver={DRIVER}"]


def test_a_write_sends_the_objects_json_as_it_is(api, kube):
    doc = changed(slice_doc(name="s"), at("spec.devices.0.fieldFromTheFuture", {"x": 1}))
    kube.create_resource_slice(ResourceSlice.model_validate(doc))
    (request,) = api.seen("POST", SLICES)
    assert request.body == ResourceSlice.model_validate(doc).to_api()
    assert request.content_type == "application/json"


def test_writes_carry_the_credentials_of_the_kubeconfig(api, tmp_path):
    kube = KubeCluster.from_config(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    read = kube.create_resource_slice(a_slice())
    kube.update_resource_slice(read)
    assert [r.authorization for r in api.requests] == ["Bearer secret-token"] * 2


def test_a_refusal_without_causes_is_invalid_with_the_servers_message(api, kube):
    api.failures.append(422)
    with pytest.raises(Invalid) as refused:
        kube.create_resource_slice(a_slice(name="s"))
    assert refused.value.errors == (FieldError("", "injected failure 422"),)
    assert str(refused.value) == "create resourceslice s is invalid: injected failure 422"


def test_other_failures_of_a_write_say_what_failed(api, kube):
    api.failures.append(500)
    with pytest.raises(
        ClusterError, match=r"create resourceslice n1-\*: injected failure 500 \(HTTP 500\)"
    ):
        kube.create_resource_slice(
            ResourceSlice.model_validate(
                changed(slice_doc(), at("metadata", {"generateName": "n1-"}))
            )
        )
    api.close()
    with pytest.raises(ClusterError, match="update resourceslice s"):
        kube.update_resource_slice(a_slice(name="s"))


def test_an_answer_gpushare_cannot_read_is_a_cluster_error(memory, api, kube):
    api.failures.append(200)  # a Status where a ResourceSlice belongs
    with pytest.raises(ClusterError, match="ResourceSlice gpushare cannot read"):
        kube.get_resource_slice("s")
