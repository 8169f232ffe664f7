"""What the node's components share (the device plugin, the DRA driver): the GPU
backends (`backends/`: discovery, device files, health) and the CUDA interposer's
files on the node (`interposer.py`: the grants and mounts a container is given)."""
