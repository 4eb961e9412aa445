"""Pod device IDs: checkpoint parsing, and the client over a real gRPC unix socket."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from cni.errors import CNIError, ErrorCode
from meta.podresources import checkpoint
from meta.podresources.client import PodResourcesClient, device_ids
from tests.kubelet import serve

SRIOV = "intel.com/sriov_a"


def _checkpoint(entries: list[dict[str, Any]]) -> str:
    return json.dumps(
        {
            "Data": {"PodDeviceEntries": entries, "RegisteredDevices": {SRIOV: ["x"]}},
            "Checksum": 12345,
        }
    )


def _entry(uid: str, ids: Any, resource: str = SRIOV, container: str = "app") -> dict[str, Any]:
    return {
        "PodUID": uid,
        "ContainerName": container,
        "ResourceName": resource,
        "DeviceIDs": ids,
        "AllocResp": "CgA=",
    }


def test_checkpoint_device_ids_as_a_list() -> None:
    text = _checkpoint(
        [
            _entry("u1", ["0000:3b:02.2", "0000:3b:02.1"]),
            _entry("u1", ["0000:3b:02.3"], container="sidecar"),
            _entry("u2", ["0000:3b:02.4"]),
            _entry("u1", ["gpu-0"], resource="nvidia.com/gpu"),
        ]
    )
    assert checkpoint.pod_devices(text, "u1") == {
        SRIOV: {"0000:3b:02.1", "0000:3b:02.2", "0000:3b:02.3"},
        "nvidia.com/gpu": {"gpu-0"},
    }
    assert checkpoint.pod_devices(text, "nobody") == {}


def test_checkpoint_device_ids_per_numa_node() -> None:
    text = _checkpoint(
        [_entry("u1", {"0": ["0000:3b:02.1"], "1": ["0000:af:02.1", "0000:af:02.0"]})]
    )
    assert checkpoint.pod_devices(text, "u1") == {
        SRIOV: {"0000:3b:02.1", "0000:af:02.0", "0000:af:02.1"}
    }


def test_checkpoint_without_entries_and_garbage() -> None:
    assert checkpoint.pod_devices(json.dumps({"Data": {"PodDeviceEntries": None}}), "u") == {}
    with pytest.raises(CNIError) as info:
        checkpoint.pod_devices("{", "u", "/ck")
    assert info.value.code == ErrorCode.DECODE_FAILURE
    assert "/ck: not a device manager checkpoint" in info.value.msg


def test_client_falls_back_to_the_checkpoint_when_the_socket_is_missing(tmp_path: Path) -> None:
    ck = tmp_path / "kubelet_internal_checkpoint"
    ck.write_text(_checkpoint([_entry("u1", ["b", "a"])]))
    client = PodResourcesClient(str(tmp_path / "missing.sock"), str(ck))
    assert client.device_ids("ns", "pod", "u1", SRIOV) == ["a", "b"]
    assert client.device_ids("ns", "pod", "u1", "other/res") == []


def test_client_error_names_both_sources(tmp_path: Path) -> None:
    sock, ck = tmp_path / "kubelet.sock", tmp_path / "checkpoint"
    with pytest.raises(CNIError) as info:
        device_ids("ns", "pod", "u1", SRIOV, str(sock), str(ck))
    assert info.value.code == ErrorCode.IO_FAILURE
    assert "cannot find the devices of pod ns/pod" in info.value.msg
    assert f"{sock} does not exist" in info.value.msg
    assert str(ck) in info.value.msg


def test_checkpoint_fallback_needs_the_pod_uid(tmp_path: Path) -> None:
    ck = tmp_path / "checkpoint"
    ck.write_text(_checkpoint([]))
    with pytest.raises(CNIError, match="K8S_POD_UID") as info:
        device_ids("ns", "pod", "", SRIOV, str(tmp_path / "none.sock"), str(ck))
    assert info.value.code == ErrorCode.INVALID_ENV


def test_grpc_list_round_trip(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    allocations = {
        ("ns", "pod"): {
            "app": {SRIOV: ["0000:3b:02.2", "0000:3b:02.1"], "nvidia.com/gpu": ["g0"]},
            "sidecar": {SRIOV: ["0000:3b:02.0"]},
        },
        ("other", "pod"): {"app": {SRIOV: ["0000:3b:02.7"]}},
    }
    with serve(sock, allocations) as kubelet:
        client = PodResourcesClient(str(sock), str(tmp_path / "no-checkpoint"))
        assert client.device_ids("ns", "pod", "uid-ignored", SRIOV) == [
            "0000:3b:02.0",
            "0000:3b:02.1",
            "0000:3b:02.2",
        ]
        assert client.pod_devices("ns", "pod", "") == {
            SRIOV: {"0000:3b:02.0", "0000:3b:02.1", "0000:3b:02.2"},
            "nvidia.com/gpu": {"g0"},
        }
        assert client.device_ids("ns", "absent", "u", SRIOV) == []
        assert kubelet.calls == 3


def test_dead_socket_falls_back_to_the_checkpoint_quickly(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.close()  # a stale socket file: connect() is refused
    ck = tmp_path / "checkpoint"
    ck.write_text(_checkpoint([_entry("u1", ["d1"])]))
    start = time.monotonic()
    assert PodResourcesClient(str(sock), str(ck), timeout=1.0).device_ids(
        "ns", "pod", "u1", SRIOV
    ) == ["d1"]
    assert time.monotonic() - start < 5
