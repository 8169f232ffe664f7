"""Refusals: errors as values, each naming the rule and saying what the user can do.

A refusal travels unchanged from the core to the HTTP response, the gRPC status,
the pod event and the log line, so its message is written for the person who
reads it there.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Rule(StrEnum):
    """Every rule a pod or a placement can break. The value is a stable short name
    (used as a metric label and printed in brackets after the message)."""

    # Rules about the pod itself: refused at submission by the admission webhook.
    NOT_AN_INTEGER = "not-an-integer"
    REQUEST_NOT_EQUAL_LIMIT = "request-not-equal-limit"
    REQUEST_WITHOUT_LIMIT = "request-without-limit"
    CORE_STEP = "core-multiple-of-5"
    CORE_RANGE = "core-range"
    CORE_NEEDS_MEM = "core-needs-gpu-mem"
    CORE_WITH_MULTI_GPU = "core-with-multi-gpu"
    MULTI_GPU_LABEL = "multi-gpu-label"
    MULTI_GPU_SPLIT = "multi-gpu-split"
    EXCLUSIVE_WITH_SHARED = "exclusive-with-shared"
    MIXED_JOB_TYPES = "mixed-job-types"
    UNKNOWN_POLICY = "unknown-placement-policy"
    ZERO_GPU_MEM = "gpu-mem-zero"
    # Rules about a pod and the cluster's GPUs: refused at submission by the webhook.
    LARGER_THAN_ANY_GPU = "larger-than-any-gpu"
    MORE_GPUS_THAN_ANY_NODE = "more-gpus-than-any-node"

    # Rules about a pod on a particular node: reported by filter and bind.
    NODE_NOT_SHARED = "node-not-gpu-shared"
    NODE_MODE_NO_COMPUTE = "node-mode-no-compute"
    TOO_FEW_GPUS = "too-few-gpus"
    GPU_TOO_SMALL = "gpu-too-small"
    UNHEALTHY_GPUS = "unhealthy-gpus"
    INSUFFICIENT_MEMORY = "insufficient-gpu-memory"
    INSUFFICIENT_CORE = "insufficient-gpu-core"
    NO_FREE_GPU = "no-free-whole-gpu"
    PODS_PER_GPU = "pods-per-gpu-limit"
    JOB_TYPE_MIXING = "job-type-mixing"
    NO_JOINT_FIT = "containers-do-not-fit-together"
    NODE_UNKNOWN = "node-unknown"
    UNKNOWN_ALLOCATION = "unknown-allocation"
    # Rules about host resources and GPU models, checked where the node tracks them
    # (the simulator; on Kubernetes the kube-scheduler checks CPU and memory itself).
    INSUFFICIENT_CPU = "insufficient-cpu"
    INSUFFICIENT_HOST_MEMORY = "insufficient-host-memory"
    GPU_MODEL = "gpu-model-mismatch"

    @property
    def resolvable(self) -> bool:
        """False when no amount of waiting or preemption on that node can help."""
        return self not in _UNRESOLVABLE


_UNRESOLVABLE = frozenset(
    {
        Rule.NODE_NOT_SHARED,
        Rule.NODE_MODE_NO_COMPUTE,
        Rule.TOO_FEW_GPUS,
        Rule.GPU_TOO_SMALL,
        Rule.NODE_UNKNOWN,
        Rule.GPU_MODEL,
    }
)


@dataclass(frozen=True, slots=True)
class Refusal:
    rule: Rule
    message: str

    def __str__(self) -> str:
        return f"{self.message} [{self.rule}]"


class PodRefused(ValueError):
    """A pod breaks one or more rules of the resource model."""

    def __init__(self, refusals: Iterable[Refusal]) -> None:
        self.refusals = tuple(refusals)
        super().__init__("; ".join(str(r) for r in self.refusals))


class AnnotationError(ValueError):
    """An allocation annotation cannot be read or breaks a rule (malformed, changed after
    it was written, out of range, or from a newer version)."""
