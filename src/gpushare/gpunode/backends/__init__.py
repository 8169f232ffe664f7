"""GPU backends of the device plugin: the port (`port.py`) and its adapters.

`mock` describes GPUs by a layout (tests, the demo, kind, the bench); `nvml` reads
the node's NVIDIA GPUs, their device files and their health (`health.py`'s rules)
through NVML.
"""
