"""DRA ResourceClaims: the pod's claims, their devices' attributes, the claim status."""

from __future__ import annotations

from typing import Any

import pytest

from cni.errors import CNIError, ErrorCode
from cni.result import Result
from meta.claims import ClaimedDevices, status_by_claim
from meta.delegate import Delegate
from meta.sources.base import ClaimDevice, Pod, PodClaim
from meta.sources.claims import (
    DEVICE_ID_ATTRIBUTE,
    RESOURCE_NAME_ATTRIBUTE,
    DeviceAttributes,
    DeviceKey,
    allocated_devices,
    apply_body,
    pod_claims,
    slice_attributes,
)
from meta.sources.kube import _pod
from tests.unit.meta.test_devices import FakeDevices

RESOURCE = "intel.com/sriov_netdevice"


def _device(claim: str = "c", device_id: str = "0000:3b:02.1", **extra: str) -> ClaimDevice:
    fields = {
        "namespace": "ns",
        "claim": claim,
        "uid": f"uid-{claim}",
        "driver": "sriov.plexus.io",
        "pool": "node-a",
        "device": f"vf-{device_id[-1]}",
        "resource_name": RESOURCE,
        "device_id": device_id,
        **extra,
    }
    return ClaimDevice.model_validate(fields)


class FakeClaims:
    """A ClaimSource with fixed devices; counts reads."""

    def __init__(self, devices: list[ClaimDevice]) -> None:
        self.devices = devices
        self.reads = 0

    def claim_devices(self, pod: Pod) -> list[ClaimDevice]:
        self.reads += 1
        return self.devices

    def set_device_status(
        self, namespace: str, claim: str, uid: str, devices: list[dict[str, Any]]
    ) -> None:
        raise AssertionError("not written here")


POD = Pod(namespace="ns", name="p", uid="u", resource_claims=[PodClaim(name="vf", claim="c")])


def test_pod_claims_by_name_and_from_templates() -> None:
    spec = {
        "resourceClaims": [
            {"name": "direct", "resourceClaimName": "mine"},
            {"name": "made", "resourceClaimTemplateName": "t"},
            {"name": "pending", "resourceClaimTemplateName": "t"},
            {"name": "unneeded", "resourceClaimTemplateName": "t"},
        ]
    }
    status = {
        "resourceClaimStatuses": [
            {"name": "made", "resourceClaimName": "p-made-x1"},
            {"name": "unneeded"},
        ]
    }
    assert pod_claims(spec, status) == [
        PodClaim(name="direct", claim="mine"),
        PodClaim(name="made", claim="p-made-x1", template=True),
        PodClaim(name="pending", claim=None, template=True),
        PodClaim(name="unneeded", claim="", template=True),
    ]
    assert pod_claims({}, {}) == []


def test_informer_pods_carry_their_claims() -> None:
    obj = {
        "metadata": {"namespace": "ns", "name": "p"},
        "spec": {"resourceClaims": [{"name": "vf", "resourceClaimName": "c"}]},
    }
    assert _pod(obj).resource_claims == [PodClaim(name="vf", claim="c")]


def test_slice_attributes_need_both_multus_attributes() -> None:
    obj = {
        "spec": {
            "devices": [
                {
                    "name": "vf-1",
                    "attributes": {
                        RESOURCE_NAME_ATTRIBUTE: {"string": RESOURCE},
                        DEVICE_ID_ATTRIBUTE: {"string": "0000:3b:02.1"},
                        "pciAddress": {"string": "0000:3b:02.1"},
                    },
                },
                {"name": "vf-2", "attributes": {DEVICE_ID_ATTRIBUTE: {"string": "0000:3b:02.2"}}},
                {"name": "gpu"},
            ]
        }
    }
    assert slice_attributes(obj) == {
        "vf-1": DeviceAttributes(RESOURCE, "0000:3b:02.1"),
        "vf-2": None,
        "gpu": None,
    }


def _claim(results: list[dict[str, str]] | None) -> dict[str, Any]:
    status = {} if results is None else {"allocation": {"devices": {"results": results}}}
    return {"metadata": {"namespace": "ns", "name": "c", "uid": "uid-c"}, "status": status}


def test_allocated_devices_skip_devices_without_attributes() -> None:
    results = [
        {"request": "vf", "driver": "sriov.plexus.io", "pool": "node-a", "device": "vf-1"},
        {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"},
        {"request": "vf", "driver": "sriov.plexus.io", "pool": "node-a", "device": "vf-2",
         "shareID": "0b6c1d52-4f5e-4a36-9a39-6c2b9e0f1a77"},
    ]  # fmt: skip
    known = {
        DeviceKey("sriov.plexus.io", "node-a", "vf-1"): DeviceAttributes(RESOURCE, "0000:3b:02.1"),
        DeviceKey("sriov.plexus.io", "node-a", "vf-2"): DeviceAttributes(RESOURCE, "0000:3b:02.2"),
    }
    devices = allocated_devices(_claim(results), "claim ns/c", known.get)
    assert [(d.device, d.device_id, d.share_id, d.uid) for d in devices] == [
        ("vf-1", "0000:3b:02.1", "", "uid-c"),
        ("vf-2", "0000:3b:02.2", "0b6c1d52-4f5e-4a36-9a39-6c2b9e0f1a77", "uid-c"),
    ]


@pytest.mark.parametrize("results", [None, []])
def test_a_claim_not_allocated_is_try_again_later(results: list[dict[str, str]] | None) -> None:
    with pytest.raises(CNIError) as caught:
        allocated_devices(_claim(results), "ResourceClaim ns/c", lambda key: None)
    assert caught.value.code == ErrorCode.TRY_AGAIN_LATER
    assert caught.value.msg == "ResourceClaim ns/c is not allocated"


def test_claimed_devices_first_then_the_device_plugin_and_read_once() -> None:
    claims = FakeClaims([_device(device_id="0000:3b:02.2"), _device(device_id="0000:3b:02.1")])
    kubelet = FakeDevices({"intel.com/other": ["0000:5e:00.1"]})
    claimed = ClaimedDevices(claims, POD, kubelet)
    assert claims.reads == 0  # nothing asked yet: nothing read

    assert claimed.device_ids("ns", "p", "u", RESOURCE) == ["0000:3b:02.2", "0000:3b:02.1"]
    assert kubelet.asked == []
    assert claimed.device_ids("ns", "p", "u", "intel.com/other") == ["0000:5e:00.1"]
    assert claims.reads == 1


def test_attached_claim_devices_and_their_status() -> None:
    vf1, vf2 = _device("c1", "0000:3b:02.1"), _device("c2", "0000:3b:02.2", share_id="s-1")
    claimed = ClaimedDevices(FakeClaims([vf1, vf2]), POD, None)
    claimed.device_ids("ns", "p", "u", RESOURCE)
    delegates = [
        Delegate(network="cluster", ifname="eth0", config={}, default=True),
        Delegate(network="ns/vf", ifname="net1", config={}, device_id="0000:3b:02.1"),
    ]
    results = [
        Result.from_dict({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]}),
        Result.from_dict(
            {
                "cniVersion": "1.0.0",
                "interfaces": [
                    {"name": "vf-host", "mac": "02:00:00:00:00:99"},
                    {"name": "net1", "mac": "02:00:00:00:00:01", "sandbox": "/run/netns/x"},
                ],
                "ips": [
                    {"address": "10.77.0.5/24", "interface": 1},
                    {"address": "2001:db8:0::5/64", "interface": 1},
                    {"address": "192.0.2.9/24", "interface": 0},
                ],
            }
        ),
    ]
    grouped = status_by_claim(claimed.attached(delegates, results))
    assert list(grouped) == [("ns", "c1", "uid-c1")]  # vf2 was not attached
    (entry,) = grouped[("ns", "c1", "uid-c1")]
    (condition,) = entry.pop("conditions")
    assert entry == {
        "driver": "sriov.plexus.io",
        "pool": "node-a",
        "device": "vf-1",
        "networkData": {
            "interfaceName": "net1",
            "ips": ["10.77.0.5/24", "2001:db8::5/64"],  # canonical, as the API requires
            "hardwareAddress": "02:00:00:00:00:01",
        },
    }
    assert {k: condition[k] for k in ("type", "status", "reason")} == {
        "type": "Ready",
        "status": "True",
        "reason": "NetworkAttached",
    }
    assert condition["message"] == "attached as net1 by network ns/vf"


def test_apply_body_names_the_claim_and_its_uid() -> None:
    body = apply_body("ns", "c", "uid-c", [{"driver": "d"}])
    assert body == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "uid-c"},
        "status": {"devices": [{"driver": "d"}]},
    }
