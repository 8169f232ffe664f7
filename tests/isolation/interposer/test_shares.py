"""Compute shares at the call, under each cGPU policy: the agent's gates hold each
container's launches to what its policy promises it, within 3 points of the GPU's time,
two containers contending (30/70 percent, weights 1:3) or the first alone
(tests/isolation/interposer/shares.py says how it is measured)."""

from pathlib import Path

import pytest

from gpushare.isolation.policy import Policy
from tests.fakecuda import FakeCuda
from tests.isolation.interposer.shares import measure

TOLERANCE = 0.03


@pytest.mark.parametrize("contended", [True, False], ids=["30-70-contended", "30-alone"])
@pytest.mark.parametrize("policy", [p for p in Policy if p.slices_time], ids=lambda p: p.label)
def test_each_container_gets_what_its_policy_promises(
    built: FakeCuda, tmp_path: Path, policy: Policy, contended: bool
) -> None:
    shares = measure(built, tmp_path, policy, contended)

    for name, share in shares.items():
        assert share.promised is not None
        assert share.measured == pytest.approx(share.promised, abs=TOLERANCE), (name, shares)
    if contended and policy is not Policy.SOFT:
        # Turns are taken at the gate. Soft lets both run at once and holds back only one
        # that overran, which two equal launchers may never do.
        assert all(share.held_s > 0 for share in shares.values())


def test_native_holds_no_launch(built: FakeCuda, tmp_path: Path) -> None:
    shares = measure(built, tmp_path, Policy.NATIVE, contended=True, seconds=1.0)

    assert all(share.promised is None and share.held_s == 0 for share in shares.values())
    assert sum(share.measured for share in shares.values()) == pytest.approx(1.0, abs=0.1)
