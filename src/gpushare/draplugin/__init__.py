"""The DRA driver `gpu.gpushare.io`: registers with the kubelet's plugin watcher, serves
the kubelet's DRA node API (prepare and unprepare claims, handing containers their CDI
devices) and publishes the node's GPUs as a ResourceSlice (docs/dra.md)."""
