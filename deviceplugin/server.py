"""One resource's kubelet DevicePlugin service (v1beta1), on its own unix socket.

The pool is pushed in with `update`; every open ListAndWatch stream sends the new
device list as soon as it changes. In plugin-watcher mode the same socket also serves
the registration service the kubelet's plugin watcher calls (`GetInfo`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from cni import deviceinfo
from deviceplugin.allocate import AllocationError, DeviceInfoFiles, container_response
from deviceplugin.config import ResourceConfig
from deviceplugin.kubelet import deviceplugin_pb2 as pb
from deviceplugin.kubelet import deviceplugin_pb2_grpc as pb_grpc
from deviceplugin.kubelet import pluginregistration_pb2 as reg_pb
from deviceplugin.kubelet import pluginregistration_pb2_grpc as reg_grpc
from deviceplugin.preferred import preferred_allocation
from deviceplugin.sysfs import PciNetDevice

API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
WAKE_SECONDS = 1.0  # how often an idle ListAndWatch stream checks it is still wanted

MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes, NUL included

log = logging.getLogger("plexus.deviceplugin")


class ServeError(RuntimeError):
    """A resource server cannot listen on its socket; the message says why."""


@dataclass(frozen=True)
class HostPaths:
    """Where Allocate looks and writes on the host."""

    sysfs_root: str = "/sys"
    dev_root: str = "/dev"
    devinfo_dir: str = deviceinfo.DEFAULT_DIR


class ResourceServer(pb_grpc.DevicePluginServicer, reg_grpc.RegistrationServicer):
    """Serves one resource; `update` feeds it, `start`/`stop` run its gRPC server."""

    def __init__(self, resource: ResourceConfig, socket_path: Path, paths: HostPaths) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self.paths = paths
        self._cond = threading.Condition()
        self._pool: dict[str, PciNetDevice] = {}
        self._devices: list[pb.Device] = []
        self._version = 0
        self._stopping = False
        self._server: grpc.Server | None = None
        self._files = DeviceInfoFiles(resource.full_name, paths.devinfo_dir)
        self.registered = threading.Event()  # set when the plugin watcher reports success

    @property
    def name(self) -> str:
        return self.resource.full_name

    # -- the pool ---------------------------------------------------------------------

    def update(self, pool: Mapping[str, PciNetDevice], health: Mapping[str, bool]) -> bool:
        """Replace the pool; True (and streams notified) if what ListAndWatch shows changed."""
        devices = [self._device(dev, health.get(dev_id, False)) for dev_id, dev in pool.items()]
        self._files.sync(pool)
        with self._cond:
            self._pool = dict(pool)
            if devices == self._devices:
                return False
            self._devices = devices
            self._version += 1
            self._cond.notify_all()
        log.info(
            "resource %s: %d devices, unhealthy: %s",
            self.name,
            len(devices),
            ",".join(d.ID for d in devices if d.health == UNHEALTHY) or "none",
        )
        return True

    def _device(self, dev: PciNetDevice, healthy: bool) -> pb.Device:
        device = pb.Device(ID=dev.address, health=HEALTHY if healthy else UNHEALTHY)
        if dev.numa_node is not None and not self.resource.exclude_topology:
            device.topology.nodes.append(pb.NUMANode(ID=dev.numa_node))
        return device

    # -- the gRPC server --------------------------------------------------------------

    def start(self, serve_registration: bool = False) -> None:
        """Listen on `socket_path` (replacing a stale file); raises ServeError."""
        path = self.socket_path
        if len(str(path).encode()) > MAX_SOCKET_PATH:
            raise ServeError(
                f"resource {self.name}: socket path {path} is over {MAX_SOCKET_PATH} bytes"
            )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise ServeError(f"resource {self.name}: cannot use {path}: {exc.strerror}") from None
        with self._cond:
            self._stopping = False
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="dp"))
        pb_grpc.add_DevicePluginServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        if serve_registration:
            reg_grpc.add_RegistrationServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        try:
            server.add_insecure_port(f"unix://{path}")
        except RuntimeError:
            raise ServeError(f"resource {self.name}: cannot listen on {path}") from None
        server.start()
        self._server = server
        log.info("resource %s: serving on %s", self.name, self.socket_path)

    def stop(self) -> None:
        """End open streams and the server; remove the socket."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.stop(grace=1.0).wait()
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop, and remove the resource's device-info files (the plugin is going away)."""
        self.stop()
        self._files.clear()

    # -- DevicePlugin -----------------------------------------------------------------

    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        sent = -1
        while context.is_active():
            with self._cond:
                if self._stopping:
                    return
                if self._version == sent:
                    self._cond.wait(WAKE_SECONDS)
                    continue
                sent, devices = self._version, list(self._devices)
            yield pb.ListAndWatchResponse(devices=devices)

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        with self._cond:
            pool = dict(self._pool)
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse(
                    deviceIDs=preferred_allocation(
                        list(req.available_deviceIDs),
                        list(req.must_include_deviceIDs),
                        req.allocation_size,
                        pool,
                    )
                )
                for req in request.container_requests
            ]
        )

    def Allocate(
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        with self._cond:
            pool = dict(self._pool)
        responses = []
        for req in request.container_requests:
            ids = list(req.devices_ids)
            try:
                responses.append(
                    container_response(
                        self.resource,
                        ids,
                        pool,
                        sysfs_root=self.paths.sysfs_root,
                        dev_root=self.paths.dev_root,
                        devinfo_dir=self.paths.devinfo_dir,
                    )
                )
            except AllocationError as exc:
                log.error("resource %s: Allocate %s failed: %s", self.name, ids, exc)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            log.info("resource %s: allocated %s", self.name, ",".join(ids))
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    # -- pluginregistration (plugin-watcher mode) -------------------------------------

    def GetInfo(
        self, request: reg_pb.InfoRequest, context: grpc.ServicerContext
    ) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(
            type="DevicePlugin",
            name=self.name,
            endpoint=str(self.socket_path),
            supported_versions=[API_VERSION],
        )

    def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("resource %s: registered by the kubelet plugin watcher", self.name)
            self.registered.set()
        else:
            log.error("resource %s: the kubelet refused it: %s", self.name, request.error)
            self.registered.clear()
        return reg_pb.RegistrationStatusResponse()
