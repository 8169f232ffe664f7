"""Stand-ins for what a real cluster provides: a kubelet,
kube-scheduler's extender calls and scripted containers for the mock GPUs.

`gpushare demo` and the tests drive the real components through them. No product
component imports this package (an import-linter contract in pyproject.toml).
"""
