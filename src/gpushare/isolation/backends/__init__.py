"""GPU backends of the isolation agent: the port (`port.py`) and its adapters.

`mock` simulates GPUs and container processes (tests, the demo, kind, the
bench); `nvml` drives real GPUs through NVML, /proc and cgroups.
"""
