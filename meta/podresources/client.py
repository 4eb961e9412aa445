"""Device IDs the kubelet allocated to a pod: PodResources `List`, else the checkpoint file.

gRPC and the generated stubs are imported only when a lookup is made, so a CNI call
for a pod without device resources pays nothing for them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from cni.errors import CNIError, ErrorCode
from meta.podresources import checkpoint
from meta.podresources.checkpoint import DEFAULT_CHECKPOINT

if TYPE_CHECKING:
    from deviceplugin.provision.holders import KubeletAllocation
    from meta.podresources import api_pb2

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
TIMEOUT_SECONDS = 2.0


class _Unavailable(Exception):
    """The PodResources API could not answer; the reason is the message."""


class PodResourcesClient:
    """Asks the kubelet which devices a pod holds; stateless, safe to share across threads."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        checkpoint_path: str = DEFAULT_CHECKPOINT,
        timeout: float = TIMEOUT_SECONDS,
    ) -> None:
        self.socket_path = socket_path
        self.checkpoint_path = checkpoint_path
        self.timeout = timeout

    def device_ids(self, namespace: str, pod: str, uid: str, resource: str) -> list[str]:
        """The pod's device IDs for `resource`, sorted; empty if it holds none."""
        return sorted(self.pod_devices(namespace, pod, uid).get(resource, set()))

    def pod_devices(self, namespace: str, pod: str, uid: str) -> dict[str, set[str]]:
        """Resource name -> device IDs of all the pod's containers.

        PodResources (matched by namespace and name) when the socket answers; otherwise
        the device manager checkpoint (matched by UID).
        """
        try:
            return self.list_pod_devices(namespace, pod)
        except _Unavailable as exc:
            grpc_problem = str(exc)
        where = f"cannot find the devices of pod {namespace}/{pod}"
        try:
            text = Path(self.checkpoint_path).read_bytes()
        except OSError as exc:
            raise CNIError(
                ErrorCode.IO_FAILURE,
                f"{where}: the kubelet PodResources API at {self.socket_path} failed "
                f"({grpc_problem}) and the checkpoint {self.checkpoint_path} cannot be read "
                f"({exc.strerror})",
                "mount /var/lib/kubelet/pod-resources (or the device-plugins dir) into the "
                "plugin's environment",
            ) from exc
        if not uid:
            raise CNIError(
                ErrorCode.INVALID_ENV,
                f"{where}: the kubelet PodResources API at {self.socket_path} failed "
                f"({grpc_problem}) and the checkpoint fallback needs the pod UID, "
                f"but CNI_ARGS has no K8S_POD_UID",
            )
        return checkpoint.pod_devices(text, uid, self.checkpoint_path)

    def allocations(self) -> list[KubeletAllocation]:
        """Every pod's devices, for SR-IOV provisioning: PodResources `List` (pods by name);
        while its socket is absent the checkpoint (pods by UID); neither: no kubelet has
        allocated anything here. Raises CNIError when the socket is there but fails."""
        # The provisioning agent's type, imported where it asks (not by the CNI daemon).
        from deviceplugin.provision.holders import KubeletAllocation

        if os.path.exists(self.socket_path):
            try:
                listed = self._list()
            except _Unavailable as exc:
                raise CNIError(ErrorCode.IO_FAILURE, f"PodResources List: {exc}") from exc
            return [
                KubeletAllocation(
                    entry.namespace, entry.name, "", d.resource_name, tuple(d.device_ids)
                )
                for entry in listed.pod_resources
                for container in entry.containers
                for d in container.devices
            ]
        try:
            text = Path(self.checkpoint_path).read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CNIError(ErrorCode.IO_FAILURE, f"{self.checkpoint_path}: {exc.strerror}") from exc
        return [
            KubeletAllocation("", "", uid, resource, tuple(sorted(ids)))
            for uid, resources in checkpoint.all_pod_devices(text, self.checkpoint_path).items()
            for resource, ids in resources.items()
        ]

    def list_pod_devices(self, namespace: str, pod: str) -> dict[str, set[str]]:
        """PodResources `List`, reduced to one pod; raises _Unavailable if the call fails."""
        found: dict[str, set[str]] = {}
        for entry in self._list().pod_resources:
            if entry.namespace != namespace or entry.name != pod:
                continue
            for container in entry.containers:
                for devices in container.devices:
                    found.setdefault(devices.resource_name, set()).update(devices.device_ids)
        return found

    def _list(self) -> api_pb2.ListPodResourcesResponse:
        """The PodResources `List` answer; raises _Unavailable if the call fails."""
        if not os.path.exists(self.socket_path):
            raise _Unavailable(f"{self.socket_path} does not exist")
        try:
            import grpc

            from meta.podresources import api_pb2
        except ImportError as exc:
            raise _Unavailable(f"gRPC stubs missing ({exc}); run scripts/setup.sh") from exc
        target = f"unix://{os.path.abspath(self.socket_path)}"
        with grpc.insecure_channel(target) as channel:
            call = channel.unary_unary(
                LIST_METHOD,
                request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString,
                response_deserializer=api_pb2.ListPodResourcesResponse.FromString,
            )
            try:
                return call(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)
            except grpc.RpcError as exc:
                raise _Unavailable(_rpc_problem(exc)) from exc


def _rpc_problem(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    if callable(code) and callable(details):
        return f"List: {code().name}: {details()}"
    return f"List: {exc}"


def device_ids(
    namespace: str,
    pod: str,
    uid: str,
    resource: str,
    socket_path: str = DEFAULT_SOCKET,
    checkpoint_path: str = DEFAULT_CHECKPOINT,
) -> list[str]:
    """The pod's sorted device IDs for `resource` (PodResources, else the checkpoint)."""
    return PodResourcesClient(socket_path, checkpoint_path).device_ids(
        namespace, pod, uid, resource
    )
