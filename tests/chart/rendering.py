"""The chart rendered by Helm's own engine (helm-python-sdk binds Helm's Go SDK),
and each object loaded into the Kubernetes API models of the official client."""

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from helm_python import _native
from kubernetes.client import ApiClient

CHART = Path(__file__).resolve().parents[2] / "helm" / "gpushare"
RELEASE = "gs"
NAMESPACE = "gpushare-system"
FULLNAME = f"{RELEASE}-gpushare"

_API = ApiClient()

# Objects of CRDs the Kubernetes client has no models for.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("cert-manager.io/v1", "Certificate"),
    ("cert-manager.io/v1", "Issuer"),
}


@dataclass(frozen=True)
class Rendered:
    objects: list[dict[str, Any]]
    notes: str
    manifests: dict[str, str] = field(default_factory=dict)
    """Each template's output as Helm printed it (comments included), by path."""

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.all(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]


WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")


LIVE_CLUSTER = ("v1/Node",)
"""What `helm install` adds to .Capabilities.APIVersions from a live API server's
discovery (each kind, group/version/Kind) and `helm template` has not: with it the
chart renders as it does against a cluster."""


def _manifests(
    values: Mapping[str, Any],
    *,
    release: str,
    namespace: str,
    kube_version: str | None,
    api_versions: Sequence[str],
) -> dict[str, str]:
    with helm.Chart.load(CHART) as chart:
        if kube_version is None and not api_versions:
            return chart.render(dict(values), name=release, namespace=namespace, is_install=True)
        # helm-python-sdk 0.2 does not expose them, but the library's render options
        # take kube_version and api_versions (`helm template --kube-version
        # --api-versions`): .Capabilities.KubeVersion and .Capabilities.APIVersions.
        options: dict[str, Any] = {"name": release, "namespace": namespace, "is_install": True}
        if kube_version is not None:
            options["kube_version"] = kube_version
        if api_versions:
            options["api_versions"] = list(api_versions)
        rendered = _native.call_string(
            "helm_render",
            chart._raw(),  # type: ignore[attr-defined]
            json.dumps(dict(values)),
            json.dumps(options),
        )
        return json.loads(rendered)


def render(
    values: Mapping[str, Any] | None = None,
    namespace: str = NAMESPACE,
    kube_version: str | None = None,
    release: str = RELEASE,
    api_versions: Sequence[str] = (),
) -> Rendered:
    """The chart as `helm install` renders it: objects and NOTES. kube_version
    (e.g. "v1.27.0") is the cluster's .Capabilities.KubeVersion; None: Helm's default.
    api_versions are added to .Capabilities.APIVersions (LIVE_CLUSTER: as against a
    cluster; none: as `helm template` renders)."""
    manifests = _manifests(
        values or {},
        release=release,
        namespace=namespace,
        kube_version=kube_version,
        api_versions=api_versions,
    )
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return Rendered(objects, notes, manifests)


def scheduler_config(rendered: Rendered) -> dict[str, Any]:
    """The KubeSchedulerConfiguration the chart gives its kube-scheduler."""
    config_map = rendered.one("ConfigMap", f"{FULLNAME}-scheduler-config")
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
    return config


def render_chart(
    values: Mapping[str, Any],
    kube_version: str,
    *,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
) -> list[dict[str, Any]]:
    """Every object the chart renders for these values on a cluster of kube_version
    ("1.27", "v1.28.3", "v1.30.2-eks-1"), with Helm's own engine, as plain dicts.

    No cluster is contacted: kube_version stands in for .Capabilities.KubeVersion, so
    the version-dependent parts (webhook matchConditions and failurePolicy, the
    kube-scheduler image) come out as `helm install` would make them on that
    version. Raises helm_python.HelmValuesError when the values break the schema.
    """
    version = kube_version if kube_version.startswith("v") else f"v{kube_version}"
    return render(values, namespace, version, release).objects


def webhook_configurations(
    values: Mapping[str, Any],
    kube_version: str,
    *,
    namespace: str = NAMESPACE,
    release: str = RELEASE,
) -> list[dict[str, Any]]:
    """The chart's ValidatingWebhookConfiguration and MutatingWebhookConfiguration, in
    that order, as render_chart renders them ([] when webhook.enabled is false).

    Each webhook's clientConfig names the extender Service with the chart's own
    caBundle; a caller that serves the webhook elsewhere replaces clientConfig.
    """
    objects = render_chart(values, kube_version, namespace=namespace, release=release)
    return [o for kind in WEBHOOK_KINDS for o in objects if o["kind"] == kind]


def model_class(obj: Mapping[str, Any]) -> str:
    """The client's model name for an object: apps/v1 DaemonSet -> V1DaemonSet."""
    version = obj["apiVersion"].rsplit("/", 1)[-1]
    return version.capitalize() + obj["kind"]


def load_model(obj: Mapping[str, Any]) -> Any:
    return _API._ApiClient__deserialize(dict(obj), model_class(obj))  # type: ignore[attr-defined]


def dropped_fields(obj: Mapping[str, Any]) -> list[str]:
    """Paths the API model does not know: a misspelled field would be silently
    ignored by the API server's non-strict decoding, so they count as errors here."""
    round_trip = _API.sanitize_for_serialization(load_model(obj))
    return list(_missing(obj, round_trip, ""))


def _missing(original: Any, loaded: Any, path: str) -> Iterator[str]:
    if isinstance(original, dict):
        loaded = loaded if isinstance(loaded, dict) else {}
        for key, value in original.items():
            if key not in loaded:
                yield f"{path}.{key}"
            else:
                yield from _missing(value, loaded[key], f"{path}.{key}")
    elif isinstance(original, list):
        loaded = loaded if isinstance(loaded, list) else []
        for i, value in enumerate(original):
            yield from _missing(value, loaded[i] if i < len(loaded) else None, f"{path}[{i}]")


def container(pod_spec: Mapping[str, Any], name: str) -> dict[str, Any]:
    for c in pod_spec["containers"]:
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name!r} in {[c['name'] for c in pod_spec['containers']]}")


def flags(c: Mapping[str, Any]) -> dict[str, str]:
    """--flag=value arguments of a container (command and args) as a dict."""
    result = {}
    for arg in [*c.get("command", []), *c.get("args", [])]:
        if arg.startswith("--"):
            key, _, value = arg.partition("=")
            result[key] = value
    return result
