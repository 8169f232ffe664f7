"""The pure core of DRA mode: the resource.k8s.io/v1 objects, their validation, the
allocator's consumable-capacity semantics, and the mapping between ACK requests, our
allocation records and claims (docs/dra.md)."""
