"""libgpushare-cuda.so, the CUDA interposer preloaded into a container's processes: it caps
each visible GPU's memory at the call (every allocation path, however the function was
found), accounts it across the container's processes in a shared region file, shows the
cap through cuMemGetInfo and NVML, and holds kernel launches while the node's agent
closes a GPU's gate.

The C sources sit beside this file (hooks.def is the one table of hooked symbols);
`build.build_library` compiles them, and `region` reads and writes the region file.
"""
