"""Which placement policy places a pod on a node.

Pod annotation `gpushare.io/placement-policy` > node label `ack.node.gpu.placement`
> the extender's `--default-placement`. `known` is the names of the extender's
policy registry (gpushare.placement.policies.POLICIES unless it was given another), so a
policy added there is usable without touching the extender.
"""

from collections.abc import Collection, Mapping
from typing import Final

from gpushare.errors import Refusal, Rule
from gpushare.labels import LABEL_PLACEMENT

POD_POLICY_ANNOTATION: Final = "gpushare.io/placement-policy"


def _normal(value: str | None) -> str:
    return (value or "").strip().lower()


def pod_policy(annotations: Mapping[str, str], known: Collection[str]) -> str | None:
    """The policy the pod asks for, or None when it asks for none (or for an unknown
    one, which the admission webhook refuses before it gets here)."""
    name = _normal(annotations.get(POD_POLICY_ANNOTATION))
    return name if name in known else None


def node_policy(labels: Mapping[str, str], default: str, known: Collection[str]) -> str:
    """The policy the node's label names, or `default` when absent or unknown."""
    name = _normal(labels.get(LABEL_PLACEMENT))
    return name if name in known else default


def check_pod_policy(annotations: Mapping[str, str], known: Collection[str]) -> Refusal | None:
    """A refusal when the pod names a policy this extender does not know."""
    value = annotations.get(POD_POLICY_ANNOTATION)
    if value is None or _normal(value) in known:
        return None
    return Refusal(
        Rule.UNKNOWN_POLICY,
        f"pod annotation {POD_POLICY_ANNOTATION}={value!r} names no placement policy; "
        f"use one of {', '.join(sorted(known))}, or remove it",
    )


def validate_default(name: str, known: Collection[str]) -> str:
    """The flag's value, checked: a typo must stop the extender at start."""
    normal = _normal(name)
    if normal not in known:
        raise ValueError(
            f"--default-placement {name!r} is not a placement policy; "
            f"known: {', '.join(sorted(known))}"
        )
    return normal
