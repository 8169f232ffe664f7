"""The rules a pod must follow, as parse_pod_request enforces them."""

import pytest

from gpushare.errors import PodRefused, Rule
from gpushare.request import ContainerRole, JobType, parse_pod_request
from tests.builders import container, pod


def refused_rules(p) -> set[Rule]:
    with pytest.raises(PodRefused) as refused:
        parse_pod_request(p)
    return {r.rule for r in refused.value.refusals}


def test_a_pod_without_our_resources_is_not_a_gpu_pod():
    assert parse_pod_request(pod(containers=[{"name": "web"}])) is None


def test_memory_only_request():
    request = parse_pod_request(pod(mem=3))
    assert request is not None
    (c,) = request.containers
    assert (c.name, c.gpus, c.mem, c.core, c.exclusive) == ("main", 1, 3, 0, False)
    assert request.job_type is JobType.MEMORY


def test_memory_and_core_request():
    request = parse_pod_request(pod(mem=2, core=30))
    assert request is not None
    assert request.containers[0].core == 30
    assert request.job_type is JobType.MEMORY_CORE


@pytest.mark.parametrize("core", [33, 1, 99, 7])
def test_core_must_be_a_multiple_of_5(core):
    assert Rule.CORE_STEP in refused_rules(pod(mem=2, core=core))


def test_the_refusal_names_the_rule_and_the_value():
    with pytest.raises(PodRefused) as refused:
        parse_pod_request(pod(mem=2, core=33))
    assert "multiple of 5, got 33" in str(refused.value)
    assert "[core-multiple-of-5]" in str(refused.value)


@pytest.mark.parametrize("core", [105, 200])
def test_core_is_at_most_100(core):
    assert Rule.CORE_RANGE in refused_rules(pod(mem=2, core=core))


def test_core_at_the_bounds_is_accepted():
    assert parse_pod_request(pod(mem=1, core=5)) is not None
    assert parse_pod_request(pod(mem=1, core=100)) is not None


def test_core_needs_memory():
    assert refused_rules(pod(core=30)) == {Rule.CORE_NEEDS_MEM}


def test_request_must_equal_limit():
    p = pod(containers=[container("c", mem=2, requests={"aliyun.com/gpu-mem": "3"})])
    assert refused_rules(p) == {Rule.REQUEST_NOT_EQUAL_LIMIT}


def test_equal_request_and_limit_is_fine():
    p = pod(containers=[container("c", mem=2, requests={"aliyun.com/gpu-mem": "2"})])
    assert parse_pod_request(p) is not None


def test_request_without_limit_is_refused():
    p = pod(containers=[container("c", requests={"aliyun.com/gpu-mem": "2"})])
    assert refused_rules(p) == {Rule.REQUEST_WITHOUT_LIMIT}


@pytest.mark.parametrize("value", ["1.5", "2Gi", "-1", "abc", "500m"])
def test_quantities_must_be_whole_numbers(value):
    assert Rule.NOT_AN_INTEGER in refused_rules(pod(mem=value))


def test_zero_means_not_requested():
    assert parse_pod_request(pod(mem=0)) is None


def test_multi_gpu_label_splits_memory_evenly():
    request = parse_pod_request(pod(mem=8, labels={"aliyun.com/gpu-count": "2"}))
    assert request is not None
    (c,) = request.containers
    assert (c.gpus, c.mem, c.total_mem) == (2, 4, 8)


def test_multi_gpu_split_must_be_even():
    p = pod(mem=7, labels={"aliyun.com/gpu-count": "2"})
    assert refused_rules(p) == {Rule.MULTI_GPU_SPLIT}


@pytest.mark.parametrize("value", ["0", "two", "-2", "1.5"])
def test_multi_gpu_label_must_be_a_positive_whole_number(value):
    assert Rule.MULTI_GPU_LABEL in refused_rules(pod(mem=8, labels={"aliyun.com/gpu-count": value}))


def test_no_core_with_the_multi_gpu_label():
    p = pod(mem=8, core=50, labels={"aliyun.com/gpu-count": "2"})
    assert Rule.CORE_WITH_MULTI_GPU in refused_rules(p)


def test_gpu_count_limit_means_whole_exclusive_gpus():
    request = parse_pod_request(pod(count=2))
    assert request is not None
    (c,) = request.containers
    assert c.exclusive and c.gpus == 2
    assert request.job_type is JobType.EXCLUSIVE


def test_gpu_count_cannot_be_combined_with_a_slice():
    assert refused_rules(pod(mem=2, count=1)) == {Rule.EXCLUSIVE_WITH_SHARED}


def test_containers_must_agree_on_compute():
    p = pod(containers=[container("a", mem=2, core=20), container("b", mem=2)])
    assert refused_rules(p) == {Rule.MIXED_JOB_TYPES}


def test_every_broken_rule_is_reported_at_once():
    p = pod(containers=[container("a", mem="1.5"), container("b", mem=2, core=33)])
    assert refused_rules(p) == {Rule.NOT_AN_INTEGER, Rule.CORE_STEP}


def test_init_containers_and_sidecars_are_first_class():
    p = pod(
        containers=[container("app", mem=4)],
        init_containers=[
            container("init", mem=1),
            container("sidecar", mem=2, restart_policy="Always"),
        ],
    )
    request = parse_pod_request(p)
    assert request is not None
    roles = {c.name: (c.role, c.index) for c in request.containers}
    assert roles == {
        "init": (ContainerRole.INIT, 0),
        "sidecar": (ContainerRole.SIDECAR, 1),
        "app": (ContainerRole.APP, 0),
    }
    assert request.total_mem == 6  # init memory is reused, sidecar runs with the app


def test_equal_requests_have_equal_shapes():
    a = parse_pod_request(pod("a", mem=2, core=10))
    b = parse_pod_request(pod("b", mem=2, core=10))
    assert a is not None and b is not None
    assert a.shape == b.shape
