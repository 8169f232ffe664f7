"""The kubelet's gRPC APIs, as stubs generated from proto/ by protogen.py: the device
plugin API v1beta1 (`deviceplugin.v1beta1`), PodResources v1 (`podresources.v1`), plugin
registration v1 (`pluginregistration.v1`), the DRA node API v1 and v1beta1 (`dra.v1`,
`dra.v1beta1`) and DRA device health v1alpha1 (`dra.health.v1alpha1`).

Adapter layer: the device plugin, the DRA driver and the kubelet stand-ins import it;
nothing here imports them. The generated folders are not edited by hand
(docs/contracts.md#proto-files)."""
