"""The pure core of gpushare: resources, rules, allocations, placement, annotation codec.

Nothing in this package does I/O. Adapters (gRPC, HTTP, the Kubernetes API, NVML,
files) live in the packages of each part and call in here.
"""
