"""The structured allocator's device choice on one node (DRA-INTERFACES §6), as
gpushare.dra.allocator models it: each test names the fact it holds."""

from itertools import count

import pytest

from gpushare.dra.allocator import (
    SEARCH_BUDGET,
    Allocation,
    Device,
    DeviceClaim,
    DeviceLedger,
    DeviceRequest,
    DistinctAttribute,
    Result,
    Unfit,
)
from tests.dra.gpushapes import DRIVER, GI, exclusive_gpu, gpus, ours, shared_gpu


def ledger(*devices: Device) -> DeviceLedger:
    """A ledger whose share IDs are share-1, share-2, ... in the order it makes them."""
    numbers = count(1)
    return DeviceLedger(devices, new_share_id=lambda: f"share-{next(numbers)}")


def claim(*requests: DeviceRequest, distinct: tuple[DistinctAttribute, ...] = ()) -> DeviceClaim:
    return DeviceClaim(requests=requests, constraints=distinct)


def allocated(result: Allocation | Unfit) -> Allocation:
    assert isinstance(result, Allocation), str(result)
    return result


def unfit(result: Allocation | Unfit) -> str:
    assert isinstance(result, Unfit), result
    return result.message


def devices(allocation: Allocation | Unfit) -> list[str]:
    return [r.device for r in allocated(allocation).results]


# Our device shape (docs/dra.md#the-slice): memory 15Gi, cores 100, shares 20.


def test_twenty_claims_of_one_share_fit_one_gpu_and_the_21st_does_not():
    node = ledger(shared_gpu(0, mem_gib=40))
    for _ in range(20):
        assert devices(node.allocate(claim(gpus("main", memory=GI)))) == ["gpu-0"]
    refused = node.allocate(claim(gpus("main", memory=GI)))
    assert isinstance(refused, Unfit)
    assert str(refused) == (
        "request 'main' needs 1 device(s), 0 of the 1 matching can serve it: "
        "gpu-0 shares: 20 of 20 in use, 1 more does not fit"
    )


def test_a_claim_of_4gi_and_30_cores_does_not_fit_beside_12gi_on_a_15gi_gpu():
    node = ledger(shared_gpu(0))
    allocated(node.allocate(claim(gpus("big", memory=12 * GI))))
    message = unfit(node.allocate(claim(gpus("main", memory=4 * GI, cores=30))))
    assert "memory: 12Gi of 15Gi in use" in message
    # 3Gi and 30 cores is what is left: it fits.
    assert devices(node.allocate(claim(gpus("main", memory=3 * GI, cores=30)))) == ["gpu-0"]


def test_a_whole_gpu_claim_takes_the_gpu():
    node = ledger(shared_gpu(0), shared_gpu(1))
    allocated(node.allocate(claim(gpus("small", memory=GI))))
    whole = allocated(node.allocate(claim(gpus("whole", shares=20))))
    assert [(r.device, r.consumed_capacity) for r in whole.results] == [
        ("gpu-1", {"memory": 15 * GI, "cores": 0, "shares": 20})
    ]
    # gpu-0 still takes small claims; gpu-1 takes none.
    assert devices(node.allocate(claim(gpus("small", memory=GI)))) == ["gpu-0"]
    allocated(node.allocate(claim(gpus("rest", memory=13 * GI))))
    assert "gpu-1 memory: 15Gi of 15Gi in use" in unfit(
        node.allocate(claim(gpus("more", memory=GI)))
    )


def test_cores_are_counted_across_claims():
    node = ledger(shared_gpu(0))
    for _ in range(3):
        allocated(node.allocate(claim(gpus("main", memory=GI, cores=30))))
    assert "cores: 90 of 100 in use, 15 more" in unfit(
        node.allocate(claim(gpus("main", memory=GI, cores=11)))  # rounds up to 15
    )
    allocated(node.allocate(claim(gpus("main", memory=GI, cores=10))))


# First eligible device in slice order.


def test_the_first_eligible_device_in_slice_order_is_chosen():
    node = ledger(shared_gpu(2), shared_gpu(0), shared_gpu(1))
    assert devices(node.allocate(claim(gpus("main", memory=GI)))) == ["gpu-2"]
    allocated(node.allocate(claim(gpus("fill", memory=14 * GI))))
    # gpu-2 is full; gpu-0 comes next in slice order, not in name order.
    assert devices(node.allocate(claim(gpus("main", memory=GI)))) == ["gpu-0"]


def test_a_request_takes_only_devices_its_class_and_selectors_select():
    other = Device(driver="other.example.com", pool="node-a", name="dev-0")
    node = ledger(other, shared_gpu(0))
    assert devices(node.allocate(claim(gpus("main", memory=GI)))) == ["gpu-0"]
    picky = DeviceRequest("t4", selects=lambda d: ours(d) and d.attributes["index"] == 1)
    assert "no device matches" in unfit(ledger(shared_gpu(0)).allocate(claim(picky)))


def test_a_capacity_request_must_name_the_capacity_verbatim():
    node = ledger(shared_gpu(0))
    message = unfit(node.allocate(claim(gpus("main", **{"gpu.gpushare.io/memory": GI}))))
    assert "gpu-0 has no capacity 'gpu.gpushare.io/memory'" in message


# Count N: distinct devices.


def test_the_n_devices_of_one_request_are_distinct():
    node = ledger(shared_gpu(0), shared_gpu(1), shared_gpu(2))
    assert devices(node.allocate(claim(gpus("main", count=2, memory=GI)))) == ["gpu-0", "gpu-1"]
    message = unfit(ledger(shared_gpu(0)).allocate(claim(gpus("main", count=2, memory=GI))))
    assert "needs 2 device(s), 1 of the 1 matching can serve it" in message


# Other requests and claims reuse a shared device.


def test_two_requests_of_one_claim_may_share_a_device():
    node = ledger(shared_gpu(0), shared_gpu(1))
    both = allocated(node.allocate(claim(gpus("a", memory=4 * GI), gpus("b", memory=4 * GI))))
    assert [(r.request, r.device, r.share_id) for r in both.results] == [
        ("a", "gpu-0", "share-1"),
        ("b", "gpu-0", "share-2"),
    ]


def test_what_the_claim_itself_took_counts_against_its_later_requests():
    node = ledger(shared_gpu(0), shared_gpu(1))
    # Each alone fits gpu-0; together they do not, so b goes to gpu-1.
    both = node.allocate(claim(gpus("a", memory=8 * GI), gpus("b", memory=8 * GI)))
    assert devices(both) == ["gpu-0", "gpu-1"]


def test_every_earlier_request_of_the_claim_counts_against_a_later_one():
    node = ledger(shared_gpu(0), shared_gpu(1))
    # a and b leave gpu-0 3Gi: c's 4Gi goes on, though it fits beside b's 4Gi alone.
    three = node.allocate(
        claim(gpus("a", memory=8 * GI), gpus("b", memory=4 * GI), gpus("c", memory=4 * GI))
    )
    assert devices(three) == ["gpu-0", "gpu-0", "gpu-1"]


def test_other_claims_and_the_claims_own_requests_count_together():
    node = ledger(shared_gpu(0), shared_gpu(1))
    allocated(node.allocate(claim(gpus("held", memory=8 * GI))))
    # gpu-0 has 7Gi left: a's 4Gi fits there, b's 4Gi beside it does not.
    pair = node.allocate(claim(gpus("a", memory=4 * GI), gpus("b", memory=4 * GI)))
    assert devices(pair) == ["gpu-0", "gpu-1"]


def test_a_claims_requests_may_fill_a_device_exactly():
    node = ledger(shared_gpu(0), shared_gpu(1))
    both = node.allocate(claim(gpus("a", memory=8 * GI), gpus("b", memory=7 * GI)))
    assert devices(both) == ["gpu-0", "gpu-0"]


def test_distinct_attribute_keeps_the_claims_requests_on_different_devices():
    uuid = DistinctAttribute("gpu.gpushare.io/uuid")
    pair = claim(gpus("a", memory=GI), gpus("b", memory=GI), distinct=(uuid,))
    assert devices(ledger(shared_gpu(0), shared_gpu(1)).allocate(pair)) == ["gpu-0", "gpu-1"]
    assert "not all together" in unfit(ledger(shared_gpu(0)).allocate(pair))


def test_requests_that_fit_alone_but_not_together_are_told_so():
    uuid = DistinctAttribute("gpu.gpushare.io/uuid")
    pair = claim(gpus("a", memory=GI), gpus("b", memory=GI), distinct=(uuid,))
    assert unfit(ledger(shared_gpu(0)).allocate(pair)) == (
        "each request can be served alone, but not all together (devices of one "
        "request are distinct, exclusive devices serve one request, and constraints hold)"
    )


def test_distinct_attribute_binds_only_the_requests_it_names():
    uuid = DistinctAttribute("gpu.gpushare.io/uuid", requests=("a", "b"))
    three = claim(
        gpus("c", memory=GI), gpus("a", memory=GI), gpus("b", memory=GI), distinct=(uuid,)
    )
    # c is free to share gpu-0 with a; only a and b must differ.
    assert devices(ledger(shared_gpu(0), shared_gpu(1)).allocate(three)) == [
        "gpu-0",
        "gpu-0",
        "gpu-1",
    ]


def test_distinct_attribute_is_unmet_by_a_device_without_the_attribute():
    foreign = DistinctAttribute("example.com/uuid")  # another domain: not our attributes
    pair = claim(gpus("a", memory=GI), distinct=(foreign,))
    assert isinstance(ledger(shared_gpu(0)).allocate(pair), Unfit)


def test_unqualified_attributes_belong_to_the_drivers_domain():
    device = shared_gpu(3)
    assert device.attribute("gpu.gpushare.io/index") == 3
    assert device.attribute("index") == 3  # spelled as the slice spells it
    assert device.attribute("example.com/index") is None


# Exclusive devices: one result, ever.


def test_an_exclusive_device_serves_one_claim():
    node = ledger(exclusive_gpu(0), exclusive_gpu(1))
    assert devices(node.allocate(claim(gpus("main", memory=4 * GI)))) == ["gpu-0"]
    assert devices(node.allocate(claim(gpus("main", memory=GI)))) == ["gpu-1"]
    assert "gpu-0 is held by another claim" in unfit(node.allocate(claim(gpus("main"))))


def test_an_exclusive_device_serves_one_request_of_a_claim():
    node = ledger(exclusive_gpu(0))
    # Each asks 1Gi of the 15Gi: only the device being exclusive keeps b off gpu-0.
    pair = claim(gpus("a", memory=GI), gpus("b", memory=GI))
    assert "not all together" in unfit(node.allocate(pair))
    assert devices(
        ledger(exclusive_gpu(0), exclusive_gpu(1)).allocate(claim(gpus("a"), gpus("b")))
    ) == [
        "gpu-0",
        "gpu-1",
    ]


def test_a_refusal_names_every_matching_device_and_why_it_cannot_serve():
    node = ledger(exclusive_gpu(0), exclusive_gpu(1))
    allocated(node.allocate(claim(gpus("main", count=2))))
    assert unfit(node.allocate(claim(gpus("main")))) == (
        "request 'main' needs 1 device(s), 0 of the 2 matching can serve it: "
        "gpu-0 is held by another claim; gpu-1 is held by another claim"
    )


def test_capacity_requests_filter_exclusive_devices():
    node = ledger(exclusive_gpu(0, mem_gib=8), exclusive_gpu(1, mem_gib=16))
    assert devices(node.allocate(claim(gpus("main", memory=12 * GI)))) == ["gpu-1"]


# All or nothing, with backtracking.


def test_a_later_request_that_finds_nothing_moves_an_earlier_one():
    only_gpu0 = DeviceRequest("pinned", selects=lambda d: d.name == "gpu-0")
    node = ledger(exclusive_gpu(0), exclusive_gpu(1))
    # First fit puts "any" on gpu-0; "pinned" then finds nothing until "any" moves on.
    assert devices(node.allocate(claim(gpus("any"), only_gpu0))) == ["gpu-1", "gpu-0"]


def test_backtracking_also_moves_devices_within_a_request():
    node = ledger(shared_gpu(0), shared_gpu(1), shared_gpu(2))
    on_gpu1 = DeviceRequest(
        "pinned", selects=lambda d: d.name == "gpu-1", capacity={"memory": 14 * GI}
    )
    # "pair" first takes gpu-0 and gpu-1, which leaves gpu-1 13Gi: too little for "pinned"
    # until "pair" moves its second device on to gpu-2.
    both = node.allocate(claim(gpus("pair", count=2, memory=2 * GI), on_gpu1))
    assert devices(both) == ["gpu-0", "gpu-2", "gpu-1"]


def test_a_claim_that_does_not_fit_takes_nothing():
    node = ledger(shared_gpu(0))
    assert isinstance(
        node.allocate(claim(gpus("a", memory=8 * GI), gpus("b", memory=8 * GI))), Unfit
    )
    # Had "a" kept its 8Gi, this 15Gi claim would not fit.
    assert devices(node.allocate(claim(gpus("whole", memory=15 * GI)))) == ["gpu-0"]


def test_a_claim_too_large_to_search_is_refused_with_the_budget():
    # 9 requests on 8 exclusive devices: each fits alone, all together never; the search
    # would try every arrangement before saying so.
    node = ledger(*(exclusive_gpu(i) for i in range(8)))
    many = claim(*(gpus(f"r{i}") for i in range(9)))
    assert f"within {SEARCH_BUDGET} devices tried" in unfit(node.allocate(many))


def test_the_search_tries_up_to_its_budget_of_devices_and_no_more():
    # Only the last device is ours: finding it takes one try per device before it.
    def node_of(size: int) -> DeviceLedger:
        others = [Device("other.example.com", "node-a", f"dev-{i}") for i in range(size - 1)]
        return ledger(*others, shared_gpu(0))

    assert devices(node_of(SEARCH_BUDGET).allocate(claim(gpus("main")))) == ["gpu-0"]
    message = unfit(node_of(SEARCH_BUDGET + 1).allocate(claim(gpus("main"))))
    assert message.endswith(f"within {SEARCH_BUDGET} devices tried")


# Results: shareID and consumedCapacity only on shared devices.


def test_results_on_a_shared_device_carry_a_new_share_id_and_all_capacities():
    node = ledger(shared_gpu(0))
    first = allocated(node.allocate(claim(gpus("main", memory=4 * GI))))
    second = allocated(node.allocate(claim(gpus("main", memory=2 * GI, cores=20))))
    assert first.results == (
        Result(
            request="main",
            driver=DRIVER,
            pool="node-a",
            device="gpu-0",
            share_id="share-1",
            consumed_capacity={"memory": 4 * GI, "cores": 0, "shares": 1},
        ),
    )
    assert second.results[0].share_id == "share-2"
    assert second.results[0].consumed_capacity == {"memory": 2 * GI, "cores": 20, "shares": 1}


def test_results_on_an_exclusive_device_carry_no_share_id_and_no_capacity():
    result = allocated(ledger(exclusive_gpu(0)).allocate(claim(gpus("main", memory=GI))))
    assert result.results == (Result("main", DRIVER, "node-a", "gpu-0"),)


def test_share_ids_are_random_uuids_by_default():
    node = DeviceLedger([shared_gpu(0)])
    ids = {allocated(node.allocate(claim(gpus("m", memory=GI)))).results[0].share_id for _ in "ab"}
    assert len(ids) == 2
    assert all(i is not None and len(i) == 36 and i.count("-") == 4 for i in ids)


# The ledger: what the API holds, releasing, copies.


def test_a_recorded_result_without_share_id_holds_a_shared_device_whole():
    node = ledger(shared_gpu(0), shared_gpu(1))
    node.record(Allocation((Result("main", DRIVER, "node-a", "gpu-0"),)))
    assert devices(node.allocate(claim(gpus("main", memory=GI)))) == ["gpu-1"]


def test_a_recorded_shared_result_consumes_its_capacity():
    node = ledger(shared_gpu(0))
    held = Result("main", DRIVER, "node-a", "gpu-0", "s", {"memory": 12 * GI, "shares": 1})
    node.record(Allocation((held,)))
    assert node.used(node.devices[0]) == {"memory": 12 * GI, "shares": 1}
    assert isinstance(node.allocate(claim(gpus("main", memory=4 * GI))), Unfit)
    allocated(node.allocate(claim(gpus("main", memory=3 * GI))))


def test_results_on_devices_of_other_pools_are_not_the_ledgers_concern():
    node = ledger(shared_gpu(0), shared_gpu(1))
    elsewhere = Result("main", DRIVER, "node-b", "gpu-0")
    here = Result("main", DRIVER, "node-a", "gpu-1")
    node.record(Allocation((elsewhere, here)))
    assert devices(node.allocate(claim(gpus("main", shares=20)))) == ["gpu-0"]
    assert isinstance(node.allocate(claim(gpus("main", memory=GI))), Unfit)  # gpu-1 is held
    node.release(Allocation((elsewhere, here)))
    assert devices(node.allocate(claim(gpus("main", memory=GI)))) == ["gpu-1"]


def test_an_allocation_of_whole_and_shared_results_is_recorded_and_released_in_full():
    node = ledger(shared_gpu(0), shared_gpu(1))
    whole = Result("a", DRIVER, "node-a", "gpu-0")
    share = Result("b", DRIVER, "node-a", "gpu-1", "s", {"memory": 12 * GI, "shares": 1})
    node.record(Allocation((whole, share)))
    assert isinstance(node.allocate(claim(gpus("main", memory=4 * GI))), Unfit)
    node.release(Allocation((whole, share)))
    assert node.used(node.devices[1]) == {"memory": 0, "shares": 0}
    assert devices(node.allocate(claim(gpus("main", memory=15 * GI)))) == ["gpu-0"]


def test_releasing_an_allocation_frees_what_it_took():
    node = ledger(shared_gpu(0, mem_gib=40))
    claims = [allocated(node.allocate(claim(gpus("main", memory=GI)))) for _ in range(20)]
    node.release(claims[7])
    assert devices(node.allocate(claim(gpus("main", memory=GI)))) == ["gpu-0"]
    assert node.used(node.devices[0]) == {"memory": 20 * GI, "cores": 0, "shares": 20}


def test_releasing_an_exclusive_allocation_frees_the_device():
    node = ledger(exclusive_gpu(0))
    first = allocated(node.allocate(claim(gpus("main"))))
    node.release(first)
    assert devices(node.allocate(claim(gpus("main")))) == ["gpu-0"]


def test_releasing_what_is_not_held_is_an_error():
    node = ledger(shared_gpu(0), exclusive_gpu(1, pool="node-b"))
    with pytest.raises(ValueError, match="holds no share ghost"):
        node.release(Allocation((Result("m", DRIVER, "node-a", "gpu-0", "ghost", {"shares": 1}),)))
    with pytest.raises(ValueError, match="not held whole"):
        node.release(Allocation((Result("m", DRIVER, "node-b", "gpu-1"),)))


def test_a_share_is_released_once():
    node = ledger(shared_gpu(0))
    share = allocated(node.allocate(claim(gpus("main", memory=GI))))
    node.release(share)
    with pytest.raises(ValueError, match="holds no share share-1"):
        node.release(share)
    assert node.used(node.devices[0]) == {"memory": 0, "cores": 0, "shares": 0}


def test_a_copy_allocates_without_touching_the_original():
    node = ledger(shared_gpu(0))
    allocated(node.allocate(claim(gpus("main", memory=8 * GI))))
    twin = node.copy()
    allocated(twin.allocate(claim(gpus("main", memory=7 * GI))))
    assert twin.used(twin.devices[0])["memory"] == 15 * GI
    assert node.used(node.devices[0])["memory"] == 8 * GI
    allocated(node.allocate(claim(gpus("main", memory=7 * GI))))
