"""The kubelet's PodResources API: which device IDs a pod was allocated.

`api.proto` is the kubelet's v1 API; `api_pb2*` are generated from it at setup time
(scripts/gen-protos.py) and are not in git. `client` asks the kubelet, falling back
to the device manager's checkpoint file (`checkpoint`).
"""
