"""The resource.k8s.io/v1 half of the in-memory cluster (DRA-INTERFACES §4, §5).

Writes go through what the API server does to them, in its order: a name made from
generateName, the fields of gates that are off dropped, defaults filled, validation
(Invalid), then storage (Conflict on a name taken or a stale resourceVersion), with a
uid and the next cluster-wide resourceVersion. No watches: nothing of ours watches
these kinds.
"""

import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpushare.cluster.port import Conflict, Invalid, NotFound
from gpushare.dra.objects import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimStatus,
    ResourceClaimTemplate,
    ResourceSlice,
)
from gpushare.dra.validation import (
    ApiGates,
    FieldError,
    drop_disabled_fields,
    validate_device_class,
    validate_resource_claim,
    validate_resource_claim_template,
    validate_resource_slice,
    validate_resource_slice_update,
    with_defaults,
)

_Object = TypeVar("_Object", ResourceSlice, ResourceClaim, ResourceClaimTemplate, DeviceClass)

GENERATED_NAME_LETTERS = "bcdfghjklmnpqrstvwxz2456789"
"""What the API server appends to a generateName: 5 of these (no vowels, no lookalikes)."""


@dataclass
class _Collection(Generic[_Object]):
    plural: str
    namespaced: bool
    items: dict[str, _Object] = field(default_factory=dict)

    def key(self, namespace: str | None, name: str) -> str:
        return f"{namespace}/{name}" if self.namespaced else name

    def get(self, namespace: str | None, name: str) -> _Object:
        try:
            return self.items[self.key(namespace, name)]
        except KeyError:
            raise NotFound(f'{self.plural}.resource.k8s.io "{name}" not found') from None

    def pop(self, namespace: str | None, name: str) -> None:
        self.get(namespace, name)
        del self.items[self.key(namespace, name)]

    def conflict(self, name: str, why: str) -> Conflict:
        return Conflict(
            f'Operation cannot be fulfilled on {self.plural}.resource.k8s.io "{name}": {why}'
        )


class MemoryDra:
    """Implements gpushare.cluster.DraCluster for MemoryCluster, which inherits it and
    shares with it its lock and its resourceVersion counter."""

    _lock: threading.RLock
    _version: int

    def __init__(self, dra_gates: ApiGates) -> None:
        self.dra_gates = dra_gates
        """The API server's release and feature gates: which fields it keeps."""
        self._slices: _Collection[ResourceSlice] = _Collection("resourceslices", False)
        self._claims: _Collection[ResourceClaim] = _Collection("resourceclaims", True)
        self._templates: _Collection[ResourceClaimTemplate] = _Collection(
            "resourceclaimtemplates", True
        )
        self._classes: _Collection[DeviceClass] = _Collection("deviceclasses", False)

    # ----- ResourceSlice

    def get_resource_slice(self, name: str) -> ResourceSlice:
        with self._lock:
            return self._slices.get(None, name)

    def list_resource_slices(
        self, driver: str | None = None, node_name: str | None = None
    ) -> list[ResourceSlice]:
        with self._lock:
            return sorted(
                (
                    s
                    for s in self._slices.items.values()
                    if driver in (None, s.spec.driver) and node_name in (None, s.spec.node_name)
                ),
                key=lambda s: s.metadata.name,
            )

    def create_resource_slice(self, resource_slice: ResourceSlice) -> ResourceSlice:
        with self._lock:
            return self._create(
                self._slices,
                resource_slice,
                lambda s: validate_resource_slice(s, self.dra_gates),
            )

    def update_resource_slice(self, resource_slice: ResourceSlice) -> ResourceSlice:
        with self._lock:
            old = self._current(self._slices, resource_slice)
            new = drop_disabled_fields(resource_slice, self.dra_gates, old)
            errors = validate_resource_slice_update(new, old, self.dra_gates)
            return self._replace(self._slices, new, old, errors)

    def delete_resource_slice(self, name: str) -> None:
        with self._lock:
            self._slices.pop(None, name)

    def delete_resource_slices(self, node_name: str, driver: str | None = None) -> None:
        with self._lock:
            for doomed in self.list_resource_slices(driver, node_name):
                self._slices.pop(None, doomed.metadata.name)

    # ----- ResourceClaim

    def get_resource_claim(self, namespace: str, name: str) -> ResourceClaim:
        with self._lock:
            return self._claims.get(namespace, name)

    def list_resource_claims(self, namespace: str | None = None) -> list[ResourceClaim]:
        with self._lock:
            return sorted(
                (
                    c
                    for c in self._claims.items.values()
                    if namespace in (None, c.metadata.namespace)
                ),
                key=lambda c: c.key,
            )

    def create_resource_claim(self, claim: ResourceClaim) -> ResourceClaim:
        with self._lock:
            fresh = claim.model_copy(
                update={"spec": with_defaults(claim.spec), "status": ResourceClaimStatus()}
            )
            return self._create(self._claims, fresh, validate_resource_claim)

    def update_resource_claim(self, claim: ResourceClaim) -> ResourceClaim:
        with self._lock:
            old = self._current(self._claims, claim)
            sent = claim.model_copy(
                update={"spec": with_defaults(claim.spec), "status": old.status}
            )
            new = drop_disabled_fields(sent, self.dra_gates, old)
            errors = validate_resource_claim(new)
            if new.spec != old.spec:
                errors.append(FieldError("spec", "field is immutable"))
            return self._replace(self._claims, new, old, errors)

    def update_resource_claim_status(self, claim: ResourceClaim) -> ResourceClaim:
        with self._lock:
            old = self._current(self._claims, claim)
            new = drop_disabled_fields(
                old.model_copy(update={"status": claim.status}), self.dra_gates, old
            )
            return self._replace(self._claims, new, old, validate_resource_claim(new))

    def delete_resource_claim(self, namespace: str, name: str) -> None:
        with self._lock:
            self._claims.pop(namespace, name)

    # ----- ResourceClaimTemplate, DeviceClass

    def get_resource_claim_template(self, namespace: str, name: str) -> ResourceClaimTemplate:
        with self._lock:
            return self._templates.get(namespace, name)

    def create_resource_claim_template(
        self, template: ResourceClaimTemplate
    ) -> ResourceClaimTemplate:
        with self._lock:
            inner = template.spec.model_copy(update={"spec": with_defaults(template.spec.spec)})
            fresh = template.model_copy(update={"spec": inner})
            return self._create(self._templates, fresh, validate_resource_claim_template)

    def list_device_classes(self) -> list[DeviceClass]:
        with self._lock:
            return sorted(self._classes.items.values(), key=lambda c: c.metadata.name)

    def create_device_class(self, device_class: DeviceClass) -> DeviceClass:
        with self._lock:
            return self._create(self._classes, device_class, validate_device_class)

    # ----- what every write does

    def _create(
        self,
        collection: _Collection[_Object],
        obj: _Object,
        validate: Callable[[_Object], list[FieldError]],
    ) -> _Object:
        meta = obj.metadata
        name = meta.name or _generated(meta.generate_name, collection)
        namespace = (meta.namespace or "default") if collection.namespaced else None
        named = obj.model_copy(
            update={"metadata": meta.model_copy(update={"name": name, "namespace": namespace})}
        )
        named = drop_disabled_fields(named, self.dra_gates)
        errors = validate(named)
        if errors:
            raise Invalid(f'{obj.kind} "{name}"', errors)
        if collection.key(namespace, name) in collection.items:
            raise Conflict(f'{collection.plural}.resource.k8s.io "{name}" already exists')
        return self._store(collection, named, str(uuid.uuid4()))

    def _current(self, collection: _Collection[_Object], sent: _Object) -> _Object:
        """The stored object `sent` replaces; Conflict when `sent` was read from an
        older version of it."""
        meta = sent.metadata
        stored = collection.get(meta.namespace, meta.name)
        if meta.resource_version and meta.resource_version != stored.metadata.resource_version:
            raise collection.conflict(
                meta.name,
                "the object has been modified; please apply your changes to the latest "
                "version and try again",
            )
        return stored

    def _replace(
        self,
        collection: _Collection[_Object],
        new: _Object,
        old: _Object,
        errors: list[FieldError],
    ) -> _Object:
        if errors:
            raise Invalid(f'{new.kind} "{new.metadata.name}"', errors)
        return self._store(collection, new, old.metadata.uid or "")

    def _store(self, collection: _Collection[_Object], obj: _Object, uid: str) -> _Object:
        self._version += 1
        meta = obj.metadata.model_copy(update={"uid": uid, "resource_version": str(self._version)})
        stored = obj.model_copy(update={"metadata": meta})
        collection.items[collection.key(meta.namespace, meta.name)] = stored
        return stored


def _generated(prefix: str | None, taken: _Collection[_Object]) -> str:
    """A name from metadata.generateName, as the API server makes one; "" without one
    (validation then asks for a name)."""
    if not prefix:
        return ""
    while True:
        name = prefix + "".join(random.choices(GENERATED_NAME_LETTERS, k=5))
        if not any(o.metadata.name == name for o in taken.items.values()):
            return name
