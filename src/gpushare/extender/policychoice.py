"""Which placement policy places a pod on a node.

Pod annotation `gpushare.io/placement-policy` > node label `ack.node.gpu.placement`
> the extender's `--default-placement`. The names are those of the extender's policy
registry (gpushare.placement.policies.POLICIES unless it was given another), so a
policy added there is usable without touching the extender. `PolicyChoice` is the
one place that rule and the default's check are written: the cache, the verbs'
`PendingPod` and the webhook all ask it.
"""

from collections.abc import Mapping
from typing import Final

from gpushare.errors import Refusal, Rule
from gpushare.labels import LABEL_PLACEMENT
from gpushare.placement.fit import PlacementPolicy
from gpushare.placement.policies import DEFAULT_PLACEMENT, POLICIES, PolicyFactory, build

POD_POLICY_ANNOTATION: Final = "gpushare.io/placement-policy"


def _normal(value: str | None) -> str:
    return (value or "").strip().lower()


class PolicyChoice:
    """The registry's policy names, the default among them (checked here, once: a typo
    in `--default-placement` stops the extender at start) and the precedence rule."""

    def __init__(
        self,
        policies: Mapping[str, PolicyFactory] = POLICIES,
        default: str = DEFAULT_PLACEMENT,
    ) -> None:
        self._policies = policies
        self.names = frozenset(policies)
        """The names pods and nodes may choose a policy by."""
        normal = _normal(default)
        if normal not in self.names:
            raise ValueError(
                f"--default-placement {default!r} is not a placement policy; "
                f"known: {', '.join(sorted(self.names))}"
            )
        self.default = normal

    def build(self) -> dict[str, PlacementPolicy]:
        """A fresh object of every policy, by name: what it learns stays with its user."""
        return build(self._policies)

    def of_pod(self, annotations: Mapping[str, str]) -> str | None:
        """The policy the pod asks for, or None when it asks for none (or for an unknown
        one, which the admission webhook refuses before it gets here)."""
        name = _normal(annotations.get(POD_POLICY_ANNOTATION))
        return name if name in self.names else None

    def of_node(self, labels: Mapping[str, str]) -> str:
        """The policy the node's label names, or the default when absent or unknown."""
        name = _normal(labels.get(LABEL_PLACEMENT))
        return name if name in self.names else self.default

    @staticmethod
    def placing(pod_policy: str | None, node_policy: str) -> str:
        """The policy that places a pod on a node: the pod's, else the node's."""
        return pod_policy or node_policy

    def refusal(self, annotations: Mapping[str, str]) -> Refusal | None:
        """A refusal when the pod names a policy this extender does not know."""
        value = annotations.get(POD_POLICY_ANNOTATION)
        if value is None or _normal(value) in self.names:
            return None
        return Refusal(
            Rule.UNKNOWN_POLICY,
            f"pod annotation {POD_POLICY_ANNOTATION}={value!r} names no placement policy; "
            f"use one of {', '.join(sorted(self.names))}, or remove it",
        )
