"""A stand-in for kube-scheduler's extender calls, for the demo and tests.

For each pending pod it does what kube-scheduler does with the extender of
config/kube-scheduler-config.yaml: POST filter with the candidate node names,
POST prioritize when more than one node passed and take the best total score
(ties go to the first name; the real scheduler breaks them at random), then
POST bind. The JSON is exactly the scheduler's (docs/contracts.md#extender-json).
"""

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from gpushare.cluster import Cluster
from gpushare.objects import Pod
from gpushare.resources import SCHEDULER_NAME


@dataclass(frozen=True)
class Outcome:
    pod: str
    node: str | None = None
    """Where the pod was bound; None when it stays Pending."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Per node, why the pod does not fit there (what the FailedScheduling event says)."""
    error: str = ""


class ExtenderError(RuntimeError):
    """The extender answered something other than 200."""


class SchedulerStandIn:
    def __init__(
        self, cluster: Cluster, extender_url: str, scheduler_name: str = SCHEDULER_NAME
    ) -> None:
        self.cluster = cluster
        self.extender_url = extender_url.rstrip("/")
        self.scheduler_name = scheduler_name

    def pending(self) -> list[Pod]:
        """Pods for this scheduler with no node yet, oldest first."""
        pods = [
            p
            for p in self.cluster.list_pods().items
            if p.spec.scheduler_name == self.scheduler_name
            and not p.spec.node_name
            and not p.is_finished
            and not p.is_deleting  # kube-scheduler skips those too
        ]
        return sorted(
            pods,
            key=lambda p: (
                p.metadata.creation_timestamp is None,
                p.metadata.creation_timestamp,
                p.key,
            ),
        )

    def schedule_pending(self) -> list[Outcome]:
        return [self.schedule(p) for p in self.pending()]

    def schedule(self, pod: Pod) -> Outcome:
        names = sorted(node.name for node in self.cluster.list_nodes().items)
        manifest = {**pod.to_manifest(), "status": {}}
        args = {"Pod": manifest, "Nodes": None, "NodeNames": names}
        answer = self._post("filter", args)
        if answer.get("Error"):
            return Outcome(pod.key, error=answer["Error"])
        passed = answer.get("NodeNames") or []
        if not passed:
            reasons = {
                **answer.get("FailedNodes", {}),
                **answer.get("FailedAndUnresolvableNodes", {}),
            }
            return Outcome(pod.key, reasons=dict(sorted(reasons.items())))
        scores = {name: 0 for name in passed}
        if len(passed) > 1:
            for entry in self._post("prioritize", {**args, "NodeNames": passed}):
                if entry["Host"] in scores:
                    scores[entry["Host"]] = entry["Score"]
        node = min(passed, key=lambda name: (-scores[name], name))
        meta = pod.metadata
        binding = {
            "PodName": meta.name,
            "PodNamespace": meta.namespace,
            "PodUID": meta.uid,
            "Node": node,
        }
        error = self._post("bind", binding).get("Error", "")
        return Outcome(pod.key, node=None if error else node, error=error)

    def _post(self, verb: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            f"{self.extender_url}/{verb}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            raise ExtenderError(f"{verb}: HTTP {err.code}: {err.read().decode()}") from err
