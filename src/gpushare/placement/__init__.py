"""The placement core: does a pod fit on a node, on which GPUs, and which node is best.

`fit` holds the exact fit search every policy shares (`evaluate`, `PlacementPolicy`,
`to_allocation`); `policies` the registry the extender and the simulator choose from
(binpack, spread, and the fragmentation-aware `bestfit`, `fgd`, `fgd-lookahead`);
`fragmentation` and `workload` what the fragmentation-aware policies measure against;
`preemption` the victims to evict so a pod fits. Pure: no I/O, no component imported.
"""
