"""The kubelet's gRPC APIs the device plugin speaks: device plugin v1beta1 and plugin
registration v1 (stubs generated at setup by scripts/gen-protos.py)."""
