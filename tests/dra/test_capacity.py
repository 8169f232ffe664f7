"""Consumable capacity as kube-scheduler's allocator counts it (DRA-INTERFACES §6):
each test names the fact it holds."""

from gpushare.dra.capacity import (
    Capacity,
    Ineligible,
    RequestPolicy,
    ValidRange,
    consumed,
    consumption,
    fits,
)
from tests.dra.gpushapes import CORES_POLICY, GI, SHARES_POLICY, memory_policy, shared_gpu

MEMORY = memory_policy(15)


# (1) No request entry: the policy's default, else the full value.


def test_a_request_that_does_not_name_a_capacity_takes_the_policy_default():
    assert consumed(100, CORES_POLICY, None) == 0
    assert consumed(20, SHARES_POLICY, None) == 1
    assert consumed(15 * GI, MEMORY, None) == 15 * GI


def test_no_request_and_no_policy_takes_the_full_value():
    assert consumed(15 * GI, None, None) == 15 * GI


def test_no_request_and_a_policy_without_default_takes_the_full_value():
    policy = RequestPolicy(valid_range=ValidRange(min=1, step=1))
    assert consumed(40, policy, None) == 40


# (2) A request and no policy: as requested.


def test_a_request_without_policy_is_taken_as_requested():
    assert consumed(15 * GI, None, 4 * GI) == 4 * GI
    assert consumed(15 * GI, None, 4 * GI + 1) == 4 * GI + 1  # no rounding either


def test_a_request_under_a_policy_with_only_a_default_is_taken_as_requested():
    assert consumed(100, RequestPolicy(default=10), 33) == 33


# (3) validRange: below min => min, else up to min + n*step, above max => ineligible.


def test_valid_range_rounds_up_to_the_next_step():
    assert consumed(15 * GI, MEMORY, 3 * GI + 1) == 4 * GI
    assert consumed(100, CORES_POLICY, 33) == 35
    assert consumed(100, CORES_POLICY, 31) == 35


def test_valid_range_keeps_an_amount_already_on_a_step():
    assert consumed(15 * GI, MEMORY, 3 * GI) == 3 * GI
    assert consumed(100, CORES_POLICY, 30) == 30


def test_valid_range_counts_steps_from_min_not_from_zero():
    policy = RequestPolicy(valid_range=ValidRange(min=3, step=5))
    assert consumed(100, policy, 4) == 8  # 3 + 1*5; from zero it would be 5
    assert consumed(100, policy, 13) == 13  # 3 + 2*5; from zero it would be 15


def test_valid_range_takes_min_for_a_request_below_it():
    assert consumed(15 * GI, MEMORY, 0) == GI
    assert consumed(15 * GI, MEMORY, GI // 2) == GI


def test_valid_range_without_step_takes_the_request_from_min_on():
    policy = RequestPolicy(valid_range=ValidRange(min=10))
    assert consumed(100, policy, 17) == 17
    assert consumed(100, policy, 3) == 10


def test_valid_range_above_max_is_ineligible():
    assert consumed(100, CORES_POLICY, 100) == 100
    assert consumed(100, CORES_POLICY, 101) is None


def test_valid_range_bounds_the_rounded_amount_by_max():
    policy = RequestPolicy(valid_range=ValidRange(min=0, max=100, step=30))
    assert consumed(100, policy, 90) == 90
    assert consumed(100, policy, 91) is None  # rounds up to 120


def test_valid_range_without_max_has_no_upper_bound():
    assert consumed(15 * GI, MEMORY, 64 * GI) == 64 * GI  # the value bounds it, in fits


# (4) validValues: the smallest valid value >= the request, above all => ineligible.


def test_valid_values_take_the_smallest_value_at_least_the_request():
    assert consumed(20, SHARES_POLICY, 1) == 1
    assert consumed(20, SHARES_POLICY, 2) == 20
    assert consumed(20, SHARES_POLICY, 20) == 20
    policy = RequestPolicy(valid_values=(2, 4, 8))
    assert consumed(8, policy, 3) == 4
    assert consumed(8, policy, 0) == 2


def test_valid_values_above_all_of_them_is_ineligible():
    assert consumed(20, SHARES_POLICY, 21) is None


# Eligibility of one device.


def test_a_requested_capacity_must_exist_verbatim_on_the_device():
    device = shared_gpu(0)
    missing = consumption(device.capacity, {"gpu.gpushare.io/memory": 4 * GI})
    assert missing == Ineligible("gpu.gpushare.io/memory", missing.reason)
    assert "has no capacity 'gpu.gpushare.io/memory'" in str(missing)
    assert consumption(device.capacity, {"memory": 4 * GI}) == {
        "memory": 4 * GI,
        "cores": 0,
        "shares": 1,
    }


def test_a_request_consumes_every_capacity_of_the_device_not_only_those_it_names():
    device = shared_gpu(0)
    assert consumption(device.capacity, {"cores": 30}) == {
        "memory": 15 * GI,  # memory's default is the full value
        "cores": 30,
        "shares": 1,
    }
    assert consumption(device.capacity, {"shares": 20}) == {
        "memory": 15 * GI,
        "cores": 0,
        "shares": 20,
    }


def test_an_amount_the_policy_refuses_makes_the_device_ineligible():
    refused = consumption(shared_gpu(0).capacity, {"memory": 4 * GI, "cores": 105})
    assert isinstance(refused, Ineligible)
    assert refused.capacity == "cores"
    assert str(refused) == "cores: 105 is more than its request policy allows"


def test_fits_up_to_the_value_inclusive():
    capacity = {"memory": Capacity(15 * GI, MEMORY)}
    assert fits(capacity, {"memory": 3 * GI}, {"memory": 12 * GI}) == {"memory": 3 * GI}
    too_much = fits(capacity, {"memory": 4 * GI}, {"memory": 12 * GI})
    assert too_much == Ineligible("memory", "memory: 12Gi of 15Gi in use, 4Gi more does not fit")


def test_fits_checks_the_rounded_amount_against_what_is_left():
    capacity = {"memory": Capacity(15 * GI, MEMORY)}
    # 2.5Gi asks less than the 3Gi left, but takes 3Gi after rounding: fits exactly;
    # beside 13Gi it takes 3Gi of the 2Gi left.
    assert fits(capacity, {"memory": 5 * GI // 2}, {"memory": 12 * GI}) == {"memory": 3 * GI}
    assert isinstance(fits(capacity, {"memory": 3 * GI // 2}, {"memory": 14 * GI}), Ineligible)


def test_fits_checks_every_capacity_including_those_the_request_does_not_name():
    device = shared_gpu(0)
    # Memory and cores have room, but the 20 shares are given out: the default share of a
    # request that names only memory does not fit.
    refused = fits(device.capacity, {"memory": GI}, {"memory": 10 * GI, "cores": 0, "shares": 20})
    assert isinstance(refused, Ineligible)
    assert refused.capacity == "shares"


def test_fits_counts_a_capacity_nobody_uses_yet_as_empty():
    device = shared_gpu(0)
    assert fits(device.capacity, {"memory": GI}, {}) == {"memory": GI, "cores": 0, "shares": 1}
    assert isinstance(fits(device.capacity, {"memory": 16 * GI}, {}), Ineligible)


def test_fits_refuses_a_missing_capacity_before_looking_at_what_is_used():
    refused = fits(shared_gpu(0).capacity, {"gpu-memory": GI}, {})
    assert isinstance(refused, Ineligible)
    assert refused.capacity == "gpu-memory"
