"""FakeKubeletPodResources: a test-side kubelet PodResources server on a unix socket.

A real kubelet needs a container runtime, which the unit and netns tiers do not run;
this serves the same gRPC API (`v1.PodResourcesLister`) from the generated stubs, so
the client's wire path is exercised for real.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

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
def serve(socket_path: Path, allocations: Allocations) -> Iterator[FakeKubeletPodResources]:
    """Run the fake on `socket_path` for the duration of the block."""
    servicer = FakeKubeletPodResources(allocations)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        yield servicer
    finally:
        server.stop(grace=None)
