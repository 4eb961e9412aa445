"""FAKE kubelet endpoints, test-side gRPC servers on unix sockets.

A real kubelet needs a container runtime, which the unit, netns and VM tiers do not run.
These serve the kubelet's side of two APIs from the generated stubs, so the clients'
wire paths are exercised for real:
- FakeKubeletPodResources: `v1.PodResourcesLister.List`, from a fixed table;
- FakeKubeletRegistration: `v1beta1.Registration.Register` on `kubelet.sock`, recording
  each request (and able to refuse them), as a device plugin sees the kubelet.
Plus the kubelet's client side of a device plugin: `plugin_stub`, and `next_until` to
follow a ListAndWatch stream.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.kubelet import deviceplugin_pb2 as dp_pb
from deviceplugin.kubelet import deviceplugin_pb2_grpc as dp_grpc
from meta.podresources import api_pb2, api_pb2_grpc

# (namespace, pod name) -> container name -> resource name -> device IDs
Allocations = Mapping[tuple[str, str], Mapping[str, Mapping[str, list[str]]]]


class FakeKubeletPodResources(api_pb2_grpc.PodResourcesListerServicer):
    """Answers `List` from a fixed allocation table; counts the calls."""

    def __init__(self, allocations: Allocations) -> None:
        self.allocations = allocations
        self.calls = 0

    def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        pods = []
        for (namespace, name), containers in self.allocations.items():
            pods.append(
                api_pb2.PodResources(
                    namespace=namespace,
                    name=name,
                    containers=[
                        api_pb2.ContainerResources(
                            name=container,
                            devices=[
                                api_pb2.ContainerDevices(
                                    resource_name=resource,
                                    device_ids=ids,
                                    topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=0)]),
                                )
                                for resource, ids in resources.items()
                            ],
                            cpu_ids=[2, 3],
                        )
                        for container, resources in containers.items()
                    ],
                )
            )
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)


@contextmanager
def _serving(socket_path: Path, add: Callable[[grpc.Server], None]) -> Iterator[None]:
    """A gRPC server on `socket_path`, with what `add` registers, for the block."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add(server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        yield
    finally:
        server.stop(grace=None)
        socket_path.unlink(missing_ok=True)


@contextmanager
def serve(socket_path: Path, allocations: Allocations) -> Iterator[FakeKubeletPodResources]:
    """Run the fake PodResources service on `socket_path` for the duration of the block."""
    servicer = FakeKubeletPodResources(allocations)
    add = api_pb2_grpc.add_PodResourcesListerServicer_to_server
    with _serving(socket_path, lambda server: add(servicer, server)):  # type: ignore[no-untyped-call]
        yield servicer


class FakeKubeletRegistration(dp_grpc.RegistrationServicer):
    """Records `Register` requests; refuses them (recording the attempt) while `refuse`."""

    def __init__(self) -> None:
        self.requests: list[dp_pb.RegisterRequest] = []
        self.refused = 0
        self.refuse = ""
        self.changed = threading.Condition()

    def Register(self, request: dp_pb.RegisterRequest, context: Any) -> dp_pb.Empty:
        with self.changed:
            refuse = self.refuse
            if refuse:
                self.refused += 1
            else:
                self.requests.append(request)
            self.changed.notify_all()
        if refuse:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, refuse)
        return dp_pb.Empty()

    def wait_for(
        self, count: int, *, refused: int = 0, timeout: float = 10.0
    ) -> list[dp_pb.RegisterRequest]:
        """Block until `count` accepted (and `refused` refused) requests; else fail the test."""
        with self.changed:
            if not self.changed.wait_for(
                lambda: len(self.requests) >= count and self.refused >= refused, timeout
            ):
                raise AssertionError(
                    f"{len(self.requests)} accepted and {self.refused} refused Register calls, "
                    f"expected {count} and {refused}"
                )
            return list(self.requests)


@contextmanager
def serve_registration(socket_path: Path) -> Iterator[FakeKubeletRegistration]:
    """Run the fake registration service on `socket_path` (the kubelet.sock)."""
    servicer = FakeKubeletRegistration()
    add = dp_grpc.add_RegistrationServicer_to_server
    with _serving(socket_path, lambda server: add(servicer, server)):  # type: ignore[no-untyped-call]
        yield servicer


Devices = dict[str, tuple[str, list[int]]]  # ID -> (health, NUMA nodes)


@contextmanager
def plugin_stub(socket: Path) -> Iterator[dp_grpc.DevicePluginStub]:
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        yield dp_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]


def devices(resp: dp_pb.ListAndWatchResponse) -> Devices:
    return {d.ID: (d.health, [n.ID for n in d.topology.nodes]) for d in resp.devices}


def next_until(
    stream: Iterator[dp_pb.ListAndWatchResponse], want: Callable[[Devices], bool]
) -> Devices:
    """Read the stream until a device list satisfies `want` (the RPC's timeout bounds it)."""
    for resp in stream:
        if want(found := devices(resp)):
            return found
    raise AssertionError("ListAndWatch ended")
