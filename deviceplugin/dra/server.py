"""The DRA kubelet plugin's gRPC server: DRAPlugin v1 and v1beta1, and registration.

One server listens on two sockets: the registration socket in the kubelet's
plugins_registry dir, which its plugin watcher finds and asks `GetInfo` (type
"DRAPlugin", our driver name, the service socket, the versions we serve), and the
service socket under the kubelet's plugins dir, which the kubelet then dials for
NodePrepareResources / NodeUnprepareResources. Both names carry a per-instance suffix,
so an upgraded instance registers beside the old one and the kubelet moves over to it.
"""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from deviceplugin.config import ConfigError
from deviceplugin.dra.bind import BindError
from deviceplugin.dra.prepare import ClaimRef, PrepareError, Preparer
from deviceplugin.dra.slices import DRIVER
from deviceplugin.kubelet import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from deviceplugin.kubelet import pluginregistration_pb2 as reg_pb
from deviceplugin.kubelet import pluginregistration_pb2_grpc as reg_grpc
from deviceplugin.server import MAX_SOCKET_PATH, ServeError

SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # what the kubelet may choose, best first
PREPARE_ERRORS = (PrepareError, BindError, ConfigError, OSError, ValueError)

log = logging.getLogger("plexus.deviceplugin")


class DraService:
    """DRAPlugin of one API version (`pb`: that version's message module)."""

    def __init__(self, preparer: Preparer, pb: ModuleType) -> None:
        self.preparer = preparer
        self.pb = pb

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.uid, claim.name)
            out = response.claims[claim.uid]
            try:
                prepared = self.preparer.prepare(ref)
            except PREPARE_ERRORS as exc:
                log.error("prepare %s/%s (%s): %s", ref.namespace, ref.name, ref.uid, exc)
                out.error = str(exc)
                continue
            for d in prepared.devices:
                out.devices.append(
                    self.pb.Device(
                        request_names=[d.request],
                        pool_name=d.pool,
                        device_name=d.device,
                        cdi_device_ids=[d.cdi_id],
                    )
                )
            log.info(
                "prepared %s/%s (%s): %s",
                ref.namespace,
                ref.name,
                ref.uid,
                ",".join(d.address for d in prepared.devices) or "no devices of ours",
            )
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            out = response.claims[claim.uid]
            try:
                self.preparer.unprepare(claim.uid)
            except PREPARE_ERRORS as exc:
                log.error("unprepare %s/%s (%s): %s", claim.namespace, claim.name, claim.uid, exc)
                out.error = str(exc)
                continue
            log.info("unprepared %s/%s (%s)", claim.namespace, claim.name, claim.uid)
        return response


class DraServer(reg_grpc.RegistrationServicer):
    """Serves registration and both DRAPlugin versions until `stop`."""

    def __init__(self, preparer: Preparer, registry_dir: Path, plugins_dir: Path) -> None:
        instance = uuid.uuid4().hex[:8]
        self.registration_socket = registry_dir / f"{DRIVER}-{instance}.sock"
        self.service_socket = plugins_dir / DRIVER / f"dra-{instance}.sock"
        self.preparer = preparer
        self.registered = threading.Event()  # set when the kubelet reports success
        self._server: grpc.Server | None = None

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="dra"))
        reg_grpc.add_RegistrationServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
            DraService(self.preparer, dra_v1_pb2), server
        )
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
            DraService(self.preparer, dra_v1beta1_pb2), server
        )
        # The service socket first: the kubelet dials it as soon as it sees registration.
        for path in (self.service_socket, self.registration_socket):
            if len(str(path).encode()) > MAX_SOCKET_PATH:
                raise ServeError(f"DRA plugin: socket path {path} is over {MAX_SOCKET_PATH} bytes")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.unlink(missing_ok=True)
                server.add_insecure_port(f"unix://{path}")
            except (OSError, RuntimeError) as exc:
                raise ServeError(f"DRA plugin: cannot listen on {path}: {exc}") from None
        server.start()
        self._server = server
        log.info("DRA plugin %s: registration socket %s", DRIVER, self.registration_socket)

    def stop(self) -> None:
        """Stop serving and remove both sockets (the kubelet then deregisters us)."""
        self.registration_socket.unlink(missing_ok=True)
        if self._server is not None:
            self._server.stop(grace=1.0).wait()
            self._server = None
        self.service_socket.unlink(missing_ok=True)

    def GetInfo(
        self, request: reg_pb.InfoRequest, context: grpc.ServicerContext
    ) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(
            type="DRAPlugin",
            name=DRIVER,
            endpoint=str(self.service_socket),
            supported_versions=list(SERVICES),
        )

    def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("DRA plugin %s: registered with the kubelet", DRIVER)
            self.registered.set()
        else:
            log.error("DRA plugin %s: the kubelet refused it: %s", DRIVER, request.error)
            self.registered.clear()
        return reg_pb.RegistrationStatusResponse()
