"""The JSON kube-scheduler sends and expects (extender API v1), and AdmissionReview v1.

Keys are the Go field names (PascalCase, no omitempty: nil is `null` and the key
stays); embedded Kubernetes objects use their usual camelCase JSON. Requests are
validated strictly enough that a wrong type is a 400 naming the field; answers
are built as plain JSON-ready dicts so a 5,000-node answer costs no model dump.
"""

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpushare.objects import Pod


class WireError(ValueError):
    """A request body that cannot be read; the message names the field."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class NodeList(_Wire):
    items: list[dict[str, Any]] | None = None
    """Full Node objects, echoed back unchanged when they pass."""


class ExtenderArgs(_Wire):
    """Body of filter and prioritize."""

    pod: Pod = Field(alias="Pod")
    nodes: NodeList | None = Field(default=None, alias="Nodes")
    node_names: list[str] | None = Field(default=None, alias="NodeNames")

    def candidates(self) -> list[str]:
        """Candidate node names, from NodeNames (cache-capable) or Nodes.items."""
        if self.node_names is not None:
            return self.node_names
        names = []
        for i, item in enumerate((self.nodes.items if self.nodes else None) or []):
            name = (item.get("metadata") or {}).get("name") if isinstance(item, dict) else None
            if not isinstance(name, str) or not name:
                raise WireError(f"Nodes.items.{i}.metadata.name: a node name is required")
            names.append(name)
        return names


class BindingArgs(_Wire):
    pod_name: str = Field(alias="PodName", min_length=1)
    pod_namespace: str = Field(alias="PodNamespace")
    pod_uid: str = Field(default="", alias="PodUID")
    node: str = Field(alias="Node", min_length=1)


class MetaPod(_Wire):
    uid: str = Field(alias="UID")


class MetaVictims(_Wire):
    pods: list[MetaPod] | None = Field(default=None, alias="Pods")
    num_pdb_violations: int = Field(default=0, alias="NumPDBViolations")


class Victims(_Wire):
    pods: list[Pod] | None = Field(default=None, alias="Pods")
    num_pdb_violations: int = Field(default=0, alias="NumPDBViolations")


class PreemptionArgs(_Wire):
    pod: Pod = Field(alias="Pod")
    node_name_to_victims: dict[str, Victims] | None = Field(default=None, alias="NodeNameToVictims")
    node_name_to_meta_victims: dict[str, MetaVictims] | None = Field(
        default=None, alias="NodeNameToMetaVictims"
    )

    def victims(self) -> dict[str, tuple[list[str], int]]:
        """Node → (victim UIDs, PDB violations), whichever form was sent."""
        if self.node_name_to_meta_victims is not None:
            return {
                node: ([p.uid for p in v.pods or []], v.num_pdb_violations)
                for node, v in self.node_name_to_meta_victims.items()
            }
        return {
            node: ([p.metadata.uid for p in v.pods or []], v.num_pdb_violations)
            for node, v in (self.node_name_to_victims or {}).items()
        }


class AdmissionRequest(_Wire):
    uid: str
    kind: dict[str, str] = Field(default_factory=dict)
    operation: str = ""
    namespace: str = ""
    object: dict[str, Any] | None = None
    dry_run: bool = Field(False, alias="dryRun")


class AdmissionReview(_Wire):
    api_version: str = Field(alias="apiVersion")
    kind: str
    request: AdmissionRequest


def parse(model: type[_Wire], body: bytes) -> Any:
    """The body as `model`, or WireError naming the first fields that are wrong."""
    try:
        return model.model_validate_json(body)
    except ValidationError as err:
        raise WireError(describe(err)) from None


def describe(err: ValidationError) -> str:
    problems = []
    for problem in err.errors(include_url=False)[:5]:
        where = ".".join(str(part) for part in problem["loc"]) or "body"
        if problem["type"] == "json_invalid":
            problems.append(f"body is not valid JSON: {problem['msg']}")
        else:
            problems.append(f"{where}: {problem['msg']}")
    more = err.error_count() - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


def for_scheduler(text: str) -> str:
    """`text` with "percent" written for every '%'. kube-scheduler (1.28 still) uses
    an extender's refusal reasons and errors as printf format strings, so a '%' would
    read "%!c(MISSING)" in the pod's events. The core's messages say "percent"
    already; this covers what the extender passes on from elsewhere (API server
    messages, annotation contents)."""
    return text.replace("%", " percent")


def dumps(value: Any) -> bytes:
    """Compact JSON, non-ASCII text as UTF-8. orjson: at 5,000 node names a tenth of
    what json takes (bench/extender_bench.py prints both)."""
    return orjson.dumps(value)
