"""The rules a pod must follow, as parse_pod_request enforces them."""

import pytest

from gpushare.errors import PodRefused, Rule
from gpushare.request import ContainerRole, JobType, parse_pod_request, requests_gpu
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
    # Refused for the label alone: the memory is not then judged as split in some way.
    p = pod(mem=7, labels={"aliyun.com/gpu-count": value})
    assert refused_rules(p) == {Rule.MULTI_GPU_LABEL}


def test_a_multi_gpu_label_of_one_keeps_the_memory_on_one_gpu():
    request = parse_pod_request(pod(mem=7, labels={"aliyun.com/gpu-count": "1"}))
    assert request is not None
    (c,) = request.containers
    assert (c.gpus, c.mem, c.total_mem) == (1, 7, 7)


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


def test_the_refusal_message_lists_each_rule_once_separated_for_reading():
    """What kube-scheduler shows in `kubectl describe pod` for a pod the filter refused."""
    p = pod(containers=[container("a", mem="1.5"), container("b", mem=2, core=33)])
    with pytest.raises(PodRefused) as refused:
        parse_pod_request(p)
    assert str(refused.value) == "; ".join(str(r) for r in refused.value.refusals)
    assert str(refused.value).count("; ") == 1 == len(refused.value.refusals) - 1


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


def refusal_text(p) -> str:
    with pytest.raises(PodRefused) as refused:
        parse_pod_request(p)
    return str(refused.value)


@pytest.mark.parametrize(
    "resource", ["aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage", "aliyun.com/gpu-count"]
)
@pytest.mark.parametrize("value", ["2Gi", "1.5", "500m", "1e2", "", " ", "0x10", "2 GiB"])
def test_a_quantity_that_is_not_a_whole_number_is_refused_by_name_never_a_crash(resource, value):
    p = pod(containers=[{"name": "c", "resources": {"limits": {resource: value}}}])
    text = refusal_text(p)
    assert f"container 'c': {resource} must be a whole number, got {value!r}" in text
    assert "[not-an-integer]" in text


@pytest.mark.parametrize("value", ["2Gi", "2.0", "abc", "-2"])
def test_a_request_that_is_not_a_whole_number_is_refused_as_unequal_to_its_limit(value):
    p = pod(containers=[container("c", mem=2, requests={"aliyun.com/gpu-mem": value})])
    text = refusal_text(p)
    assert f"container 'c': aliyun.com/gpu-mem request {value!r} must equal its limit '2'" in text
    assert "[request-not-equal-limit]" in text


def test_a_request_alone_is_refused_whatever_its_value():
    p = pod(containers=[container("c", requests={"aliyun.com/gpu-core.percentage": "2Gi"})])
    text = refusal_text(p)
    assert "container 'c': aliyun.com/gpu-core.percentage is set in requests only" in text
    assert "set it in limits" in text and "[request-without-limit]" in text


def test_a_whole_number_may_carry_a_sign_and_spaces():
    request = parse_pod_request(
        pod(containers=[container("c", mem="+4", requests={"aliyun.com/gpu-mem": " 4 "})])
    )
    assert request is not None
    assert request.containers[0].mem == 4


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"mem": 2, "core": 105},
            "container 'main': aliyun.com/gpu-core.percentage must be between 5 and 100 "
            "(it is a share of one GPU), got 105 [core-range]",
        ),
        (
            {"core": 30},
            "container 'main': aliyun.com/gpu-core.percentage needs aliyun.com/gpu-mem in the "
            "same container [core-needs-gpu-mem]",
        ),
        (
            {"mem": 8, "core": 50, "labels": {"aliyun.com/gpu-count": "2"}},
            "container 'main': aliyun.com/gpu-core.percentage cannot be combined with the pod "
            "label aliyun.com/gpu-count=2; split memory only, or drop the label "
            "[core-with-multi-gpu]",
        ),
        (
            {"mem": 8, "labels": {"aliyun.com/gpu-count": "1.5"}},
            "pod label aliyun.com/gpu-count must be a whole number of GPUs (1 or more), "
            "got '1.5' [multi-gpu-label]",
        ),
        (
            {"mem": 7, "labels": {"aliyun.com/gpu-count": "2"}},
            "container 'main': aliyun.com/gpu-mem=7 cannot be split evenly over "
            "aliyun.com/gpu-count=2 GPUs; use a multiple of 2 [multi-gpu-split]",
        ),
        (
            {"mem": 2, "count": 1},
            "container 'main': aliyun.com/gpu-count asks for whole GPUs and cannot be combined "
            "with aliyun.com/gpu-mem or aliyun.com/gpu-core.percentage; use one or the other "
            "[exclusive-with-shared]",
        ),
        (
            {"core": 50, "count": 1},
            "container 'main': aliyun.com/gpu-count asks for whole GPUs and cannot be combined "
            "with aliyun.com/gpu-mem or aliyun.com/gpu-core.percentage; use one or the other "
            "[exclusive-with-shared]",
        ),
    ],
)
def test_each_refusal_says_what_is_wrong_and_names_its_rule(spec, message):
    assert message in refusal_text(pod(**spec))


def test_mixed_compute_names_the_containers_on_each_side():
    p = pod(
        containers=[
            container("a", mem=2, core=20),
            container("b", mem=2),
            container("c", mem=2, core=20),
            container("d", mem=2),
        ]
    )
    assert refusal_text(p) == (
        "containers a, c set aliyun.com/gpu-core.percentage but b, d do not; set it on every "
        "container that asks for aliyun.com/gpu-mem, or on none [mixed-job-types]"
    )


@pytest.mark.parametrize("core", [1, 4])
def test_core_below_5_is_out_of_range_as_well_as_off_step(core):
    assert refused_rules(pod(mem=2, core=core)) == {Rule.CORE_STEP, Rule.CORE_RANGE}


def test_whole_gpus_mix_with_no_compute_rule():
    p = pod(containers=[container("a", count=1), container("b", mem=2, core=20)])
    request = parse_pod_request(p)
    assert request is not None
    assert request.job_type is JobType.MEMORY_CORE


def test_the_label_splits_every_container_and_counts_whole_gpus_apart():
    request = parse_pod_request(
        pod(
            containers=[container("a", mem=4), container("b", count=3)],
            labels={"aliyun.com/gpu-count": " 2 "},
        )
    )
    assert request is not None
    assert [(c.name, c.gpus, c.mem, c.exclusive) for c in request.containers] == [
        ("a", 2, 2, False),
        ("b", 3, 0, True),
    ]


@pytest.mark.parametrize(
    ("containers", "init_containers", "asks"),
    [
        ([{"name": "web"}], [], False),
        ([container("c", requests={"nvidia.com/gpu": "1"})], [], False),
        ([container("c", mem=0)], [], True),
        ([container("c", requests={"aliyun.com/gpu-mem": "2"})], [], True),
        ([{"name": "web"}], [container("init", count=1)], True),
        ([container("c", core="2Gi")], [], True),
    ],
)
def test_a_pod_asks_for_gpus_when_any_container_names_one_of_our_resources(
    containers, init_containers, asks
):
    assert requests_gpu(pod(containers=containers, init_containers=init_containers)) is asks


@pytest.mark.parametrize(
    ("spec", "described"),
    [
        ({"mem": 2}, "main: 2 GiB on one GPU"),
        ({"mem": 2, "core": 30}, "main: 2 GiB + 30 percent compute on one GPU"),
        ({"mem": 8, "labels": {"aliyun.com/gpu-count": "2"}}, "main: 4 GiB on each of 2 GPUs"),
        ({"count": 1}, "main: 1 whole GPU"),
        ({"count": 2}, "main: 2 whole GPUs"),
        (
            {"containers": [container("a", mem=1), container("b", mem=3)]},
            "a: 1 GiB on one GPU, b: 3 GiB on one GPU",
        ),
    ],
)
def test_a_request_describes_itself_for_events_without_a_percent_sign(spec, described):
    request = parse_pod_request(pod(**spec))
    assert request is not None
    assert request.describe() == described
