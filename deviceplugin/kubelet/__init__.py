"""The kubelet's gRPC APIs the device plugin speaks: device plugin v1beta1, plugin
registration v1 and the DRA plugin API v1 and v1beta1 (stubs generated at setup by
scripts/gen-protos.py)."""
