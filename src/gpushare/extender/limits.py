"""How much a request to the extender may carry, and how long it may take to arrive.

Each limit is the largest request its caller can legitimately send, computed from
the Kubernetes limits that bound it, plus room for the rest of the envelope.
Anything larger is not a request of kube-scheduler or of the API server, and is
refused (413) before it is read; so is a body that does not arrive in time (408)
or headers that never end. docs/install.md, "Security", explains each figure.
"""

from dataclasses import dataclass

KiB = 1024
MiB = 1024 * KiB

OBJECT_JSON_MAX = 3 * MiB
"""The JSON of one Kubernetes object (here a Pod) as the API server or kube-scheduler
writes it. etcd refuses a write over 1.5 MiB (its --max-request-bytes default,
1,572,864 bytes), and the API server stores protobuf; written out as JSON the same
object grows by its field names (kube-scheduler sends managedFields too), which we
allow up to twice the stored size. 3 MiB is also the most JSON the API server reads
in one write (its --max-request-body-bytes default), so a pod created from JSON
fits however it was stored."""

NODES_MAX = 5000
"""Nodes of the largest cluster Kubernetes supports (its scalability thresholds):
the most names one filter or prioritize carries."""

NAME_MAX = 253
"""A node's or a pod's name: a DNS-1123 subdomain, at most 253 characters."""

ENVELOPE = 64 * KiB
"""Everything a request carries besides the objects and lists counted above: keys,
the AdmissionReview's userInfo, kind and resource, options. Generous on purpose."""

EXTENDER_ARGS_MAX = OBJECT_JSON_MAX + NODES_MAX * (NAME_MAX + len('"",')) + ENVELOPE
"""filter and prioritize (ExtenderArgs, nodeCacheCapable: true): the Pod and up to
NODES_MAX names, each quoted and comma-separated. About 4.3 MiB."""

PREEMPTION_CANDIDATES_MAX = max(100, NODES_MAX * 10 // 100)
"""Candidate nodes kube-scheduler's DefaultPreemption hands the extenders: at least
minCandidateNodesAbsolute (100), else minCandidateNodesPercentage (10 %) of the
nodes."""

VICTIMS_MAX = 256
"""Pods on one node, so victims per candidate: the kubelet's maxPods (110 by
default; the large managed offerings allow up to 256)."""

META_POD = len('{"UID":""},') + 36
"""One MetaPod: a UID (36 characters) in its object, comma-separated."""

PREEMPTION_ARGS_MAX = (
    OBJECT_JSON_MAX
    + PREEMPTION_CANDIDATES_MAX
    * (NAME_MAX + len('"":{"Pods":[],"NumPDBViolations":2147483647},') + VICTIMS_MAX * META_POD)
    + ENVELOPE
)
"""preempt (ExtenderPreemptionArgs, nodeCacheCapable: true): the Pod and, per
candidate node, its name and its victims' UIDs. About 8.8 MiB."""

BINDING_ARGS_MAX = ENVELOPE
"""bind (ExtenderBindingArgs): four strings of at most NAME_MAX characters and their
keys, about 1 KiB; the envelope's allowance covers them many times over."""

ADMISSION_REVIEW_MAX = 2 * OBJECT_JSON_MAX + ENVELOPE
"""/validate and /mutate (AdmissionReview v1): an UPDATE carries the object and the
oldObject. About 6.1 MiB."""

BODY_DEADLINE = 10.0
"""Seconds a request body may take to arrive once its headers have. The largest
legitimate body crosses loopback (the verbs) or the cluster network (the webhook)
in well under a second; the callers give up sooner or about then anyway
(kube-scheduler's httpTimeout, the webhook's timeoutSeconds, 10 s in the chart)."""

HEADER_DEADLINE = 10.0
"""Seconds a connection may take to send a request's headers, from its first byte
(or from connecting). kube-scheduler and the API server send theirs at once."""

HEADER_BYTES_MAX = 64 * KiB
"""Bytes of one request's line and headers. Our callers send a few hundred."""


@dataclass(frozen=True)
class ReadLimits:
    """The deadlines a server enforces while a request arrives; tests shorten them."""

    body_deadline: float = BODY_DEADLINE
    header_deadline: float = HEADER_DEADLINE
    header_bytes: int = HEADER_BYTES_MAX


DEFAULT_READ_LIMITS = ReadLimits()
