"""Registering with the kubelet the legacy way: `Registration.Register` on kubelet.sock."""

from __future__ import annotations

from pathlib import Path

import grpc

from deviceplugin.kubelet import deviceplugin_pb2 as pb
from deviceplugin.kubelet import deviceplugin_pb2_grpc as pb_grpc
from deviceplugin.server import API_VERSION

KUBELET_SOCKET = "kubelet.sock"
TIMEOUT_SECONDS = 5.0


class RegistrationError(RuntimeError):
    """The kubelet could not be reached or refused the plugin; the message says which."""


def register(plugins_dir: Path, endpoint: str, resource_name: str) -> None:
    """Register `resource_name`, served on `<plugins_dir>/<endpoint>`, with the kubelet."""
    kubelet = plugins_dir / KUBELET_SOCKET
    request = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
    )
    with grpc.insecure_channel(f"unix://{kubelet}") as channel:
        try:
            stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            stub.Register(request, timeout=TIMEOUT_SECONDS)
        except grpc.RpcError as exc:
            raise RegistrationError(
                f"registering {resource_name} with the kubelet at {kubelet} failed: "
                f"{exc.code().name}: {exc.details()}"
            ) from None
