"""A pod's DRA claims: which containers use a request of a claim (what the DRA driver
names the container's environment after)."""

from gpushare.objects import Pod


def _pod(**status: object) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {"name": "train", "namespace": "ml", "uid": "u1"},
            "spec": {
                "resourceClaims": [
                    {"name": "gpushare", "resourceClaimTemplateName": "gpushare-0123456789"},
                    {"name": "shared", "resourceClaimName": "team-gpu"},
                ],
                "initContainers": [
                    {"name": "warmup", "resources": {"claims": [{"name": "gpushare"}]}}
                ],
                "containers": [
                    {
                        "name": "trainer",
                        "resources": {"claims": [{"name": "gpushare", "request": "trainer"}]},
                    },
                    {
                        "name": "logger",
                        "resources": {"claims": [{"name": "gpushare", "request": "logger"}]},
                    },
                    {"name": "viewer", "resources": {"claims": [{"name": "shared"}]}},
                    {"name": "plain"},
                ],
            },
            "status": status,
        }
    )


def test_a_template_claim_is_found_through_the_pod_status():
    pod = _pod(
        resourceClaimStatuses=[{"name": "gpushare", "resourceClaimName": "train-gpushare-x7k2p"}]
    )
    assert pod.claim_users("train-gpushare-x7k2p", "trainer") == ["warmup", "trainer"]
    assert pod.claim_users("train-gpushare-x7k2p", "logger") == ["warmup", "logger"]


def test_a_template_claim_not_yet_in_the_status_has_no_users():
    assert _pod().claim_users("train-gpushare-x7k2p", "trainer") == []


def test_a_named_claim_is_found_through_the_spec():
    assert _pod().claim_users("team-gpu", "any") == ["viewer"]


def test_another_claim_of_the_same_request_name_is_not_the_pods():
    assert _pod().claim_users("other", "trainer") == []
