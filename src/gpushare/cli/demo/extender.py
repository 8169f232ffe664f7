"""The extender's stage of `gpushare demo`: the real extender and admission webhook
served on loopback over the demo's in-memory cluster, pods admitted through the
webhook and placed by a scheduler stand-in over HTTP.

The webhook is served without TLS here: the demo's "API server" is this process.
"""

import base64
import json
import urllib.request
import uuid
from types import TracebackType
from typing import Any

from gpushare.annotation import decode
from gpushare.cluster.memory import MemoryCluster
from gpushare.extender.server import HttpServer
from gpushare.extender.service import ExtenderConfig, ExtenderService
from gpushare.objects import Pod
from gpushare.request import parse_pod_request
from gpushare.resources import SCHEDULER_NAME
from gpushare.standins.scheduler import Outcome, SchedulerStandIn

LARGE_MODELS = tuple(
    Pod.model_validate(
        {
            "metadata": {"name": f"llm-{i}", "namespace": "default"},
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "containers": [
                    {"name": "llm", "resources": {"limits": {"aliyun.com/gpu-mem": "48"}}}
                ],
            },
        }
    )
    for i in range(2)
)
"""Two pods of 48 GiB: only one GPU of the demo cluster holds one, so the second
stays Pending, with a reason per node (memory that may free up, or GPUs too small)."""


class ExtenderStage:
    def __init__(self, cluster: MemoryCluster) -> None:
        self.cluster = cluster
        self.service = ExtenderService(cluster, ExtenderConfig(host="127.0.0.1", port=0))
        self.service.start_watching()
        if not self.service.wait_synced(10):
            raise RuntimeError("the extender did not sync with the demo cluster")
        self.server = HttpServer(self.service.app()).start()
        self.webhook = HttpServer(self.service.webhook_app()).start()
        prefix = self.service.config.url_prefix
        self.scheduler = SchedulerStandIn(cluster, self.server.url + prefix)

    def __enter__(self) -> "ExtenderStage":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.server.stop()
        self.webhook.stop()
        self.service.stop_watching()

    def describe(self) -> str:
        return (
            f"extender {self.server.url}{self.service.config.url_prefix}, "
            f"admission webhook {self.webhook.url}"
        )

    def submit(self, pod: Pod) -> str:
        """Admits the pod through the webhook, creates it and schedules it; says what happened."""
        if not pod.metadata.namespace:
            pod = pod.model_copy(
                update={"metadata": pod.metadata.model_copy(update={"namespace": "default"})}
            )
        admitted, refusal = self.admit(pod)
        if admitted is None:
            return f"{pod.key} refused by the admission webhook: {refusal}"
        created = self.cluster.create_pod(admitted)
        return self.describe_outcome(created, self.scheduler.schedule(created))

    def describe_outcome(self, pod: Pod, outcome: Outcome) -> str:
        if outcome.node is None and outcome.reasons:
            reasons = "".join(f"\n    {node}: {why}" for node, why in outcome.reasons.items())
            return f"{pod.key} stays Pending:{reasons}"
        if outcome.node is None:
            return f"{pod.key} not bound: {outcome.error}"
        bound = self.cluster.get_pod(pod.metadata.namespace, pod.metadata.name)
        allocation = decode(bound)
        request = parse_pod_request(bound)
        if allocation is None or request is None:
            return f"{pod.key} -> {outcome.node} (asks for no shared GPU)"
        gpus = ",".join(str(i) for i in allocation.gpu_indices)
        return f"{pod.key} -> {outcome.node} GPU {gpus} ({request.describe()})"

    def admit(self, pod: Pod) -> tuple[Pod | None, str]:
        """What the API server does with the webhooks: mutate, then validate."""
        manifest = pod.to_manifest()
        mutated = self._review("mutate", manifest)
        if mutated.get("patch"):
            for op in json.loads(base64.b64decode(mutated["patch"])):
                # The only patch the webhook makes: spec.schedulerName.
                manifest.setdefault("spec", {})[op["path"].rsplit("/", 1)[1]] = op["value"]
        validated = self._review("validate", manifest)
        if not validated["allowed"]:
            return None, validated["status"]["message"]
        return Pod.model_validate(manifest), ""

    def _review(self, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE",
                "namespace": manifest["metadata"].get("namespace", "default"),
                "object": manifest,
            },
        }
        request = urllib.request.Request(
            f"{self.webhook.url}/{path}",
            data=json.dumps(review).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer: dict[str, Any] = json.loads(response.read())["response"]
            return answer
