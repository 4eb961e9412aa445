"""Device IDs for NADs with a resourceName, and device-info files."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni.deviceinfo import dp_path
from cni.errors import CNIError, ErrorCode
from meta import deviceinfo
from meta.attachments import Resolver
from meta.config import MetaConfig
from meta.delegate import Delegate
from meta.sources.base import RESOURCE_NAME_ANNOTATION, Pod
from meta.sources.store import EmbeddedStore

SRIOV = "intel.com/sriov_a"
BRIDGE = {"cniVersion": "1.0.0", "name": "cluster", "type": "bridge"}
VF = {"cniVersion": "1.0.0", "type": "sriov", "vlan": 10}


class FakeDevices:
    """A DeviceSource with fixed allocations; records what it was asked."""

    def __init__(self, allocations: dict[str, list[str]]) -> None:
        self.allocations = allocations
        self.asked: list[tuple[str, str, str, str]] = []

    def device_ids(self, namespace: str, pod: str, uid: str, resource: str) -> list[str]:
        self.asked.append((namespace, pod, uid, resource))
        return list(self.allocations.get(resource, []))


@pytest.fixture
def store(tmp_path: Path) -> EmbeddedStore:
    return EmbeddedStore(tmp_path)


def _nad(
    store: EmbeddedStore,
    name: str,
    config: dict[str, Any],
    resource: str = "",
    namespace: str = "default",
) -> None:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource:
        meta["annotations"] = {RESOURCE_NAME_ANNOTATION: resource}
    body = {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": meta,
        "spec": {"config": json.dumps(config)},
    }
    (store.directory / f"{namespace}-{name}.yaml").write_text(yaml.safe_dump(body))


def _resolve(
    store: EmbeddedStore, networks: Any, devices: FakeDevices | None, **conf: Any
) -> list[Delegate]:
    base: dict[str, Any] = {
        "cniVersion": "1.1.0",
        "name": "plexus",
        "type": "plexus",
        "delegates": [BRIDGE],
        "clusterDir": "/unused",
        **conf,
    }
    value = networks if isinstance(networks, str) else json.dumps(networks)
    pod = Pod(
        namespace="default",
        name="p",
        uid="u",
        annotations={"k8s.v1.cni.cncf.io/networks": value},
    )
    return Resolver(MetaConfig.model_validate(base), store, "eth0", devices).resolve(pod)


def _plugins(delegate: Delegate) -> list[dict[str, Any]]:
    return list(delegate.config.get("plugins", [delegate.config]))


def test_networks_sharing_a_resource_take_the_sorted_ids_in_order(store: EmbeddedStore) -> None:
    _nad(store, "vf-a", VF, SRIOV)
    _nad(store, "vf-b", {"cniVersion": "1.0.0", "plugins": [VF, {"type": "tuning"}]}, SRIOV)
    _nad(store, "plain", {"cniVersion": "1.0.0", "type": "macvlan"})
    devices = FakeDevices({SRIOV: ["0000:3b:02.3", "0000:3b:02.1", "0000:3b:02.2"]})

    delegates = _resolve(store, "vf-b, plain, vf-a, vf-b@x", devices)

    assert [(d.network, d.device_id) for d in delegates] == [
        ("cluster", ""),
        ("default/vf-b", "0000:3b:02.1"),
        ("default/plain", ""),
        ("default/vf-a", "0000:3b:02.2"),
        ("default/vf-b", "0000:3b:02.3"),
    ]
    for delegate in delegates[1:]:
        for plugin in _plugins(delegate):
            assert plugin.get("deviceID") == (delegate.device_id or None)
            assert plugin.get("pciBusID") == (delegate.device_id or None)
    assert delegates[1].resource_name == SRIOV and delegates[2].resource_name == ""
    assert devices.asked == [("default", "p", "u", SRIOV)]  # once per resource


def test_default_networks_take_ids_before_the_annotation(store: EmbeddedStore) -> None:
    _nad(store, "dflt", VF, SRIOV, namespace="kube-system")
    _nad(store, "vf", VF, SRIOV)
    delegates = _resolve(store, "vf", FakeDevices({SRIOV: ["b", "a"]}), defaultNetworks=["dflt"])
    assert [(d.network, d.device_id) for d in delegates[1:]] == [
        ("kube-system/dflt", "a"),
        ("default/vf", "b"),
    ]


def test_declared_device_id_capability_gets_the_id(store: EmbeddedStore) -> None:
    _nad(store, "vf", {**VF, "capabilities": {"deviceID": True}}, SRIOV)
    _nad(store, "plain-vf", VF, SRIOV)
    delegates = _resolve(store, "vf, plain-vf", FakeDevices({SRIOV: ["d0", "d1"]}))
    assert delegates[1].capability_args["deviceID"] == "d0"
    assert "deviceID" not in delegates[2].capability_args


def test_an_explicit_selection_device_id_wins_and_is_not_handed_out(
    store: EmbeddedStore,
) -> None:
    _nad(store, "vf", VF, SRIOV)
    devices = FakeDevices({SRIOV: ["d0", "d1"]})
    delegates = _resolve(
        store, [{"name": "vf"}, {"name": "vf", "interface": "x", "deviceID": "d0"}], devices
    )
    assert [(d.ifname, d.device_id) for d in delegates[1:]] == [("net1", "d1"), ("x", "d0")]
    assert _plugins(delegates[2])[0]["deviceID"] == "d0"


def test_no_device_left_names_the_resource_and_pod(store: EmbeddedStore) -> None:
    _nad(store, "vf", VF, SRIOV)
    with pytest.raises(CNIError) as info:
        _resolve(store, "vf, vf@x", FakeDevices({SRIOV: ["d0"]}))
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert info.value.msg == (
        f"network default/vf: no {SRIOV} device left for pod default/p "
        f"(allocated: d0; 1 taken by earlier networks)"
    )
    with pytest.raises(CNIError, match=r"allocated: none"):
        _resolve(store, "vf", FakeDevices({}))


def test_without_a_device_source_nothing_is_looked_up(store: EmbeddedStore) -> None:
    _nad(store, "vf", VF, SRIOV)
    delegates = _resolve(store, "vf", None)
    assert delegates[1].resource_name == SRIOV and delegates[1].device_id == ""
    assert "deviceID" not in delegates[1].config


# ---- device-info files --------------------------------------------------------


def test_device_info_paths_follow_multus() -> None:
    assert dp_path("/b", SRIOV, "0000:3b:02.1") == Path(
        "/b/dp/intel.com-sriov_a-0000:3b:02.1-device.json"
    )
    assert deviceinfo.cni_path("/b", "ns/net", "cid", "net1") == Path("/b/cni/ns-net-cid_net1")


def test_device_info_copy_load_and_clean(tmp_path: Path) -> None:
    base = str(tmp_path)
    info = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:3b:02.1"}}
    dest = deviceinfo.cni_path(base, "vf", "cid", "net1")
    assert deviceinfo.copy_from_dp(base, SRIOV, "0000:3b:02.1", dest) is False
    assert not dest.exists()

    dp = dp_path(base, SRIOV, "0000:3b:02.1")
    dp.parent.mkdir(parents=True)
    dp.write_text(json.dumps(info))
    assert deviceinfo.copy_from_dp(base, SRIOV, "0000:3b:02.1", dest) is True
    assert deviceinfo.load(dest) == info
    assert stat.S_IMODE(dest.stat().st_mode) == 0o444
    assert deviceinfo.copy_from_dp(base, SRIOV, "0000:3b:02.1", dest) is True  # ADD again

    deviceinfo.clean(base, dest)
    assert not dest.exists() and dp.exists()
    deviceinfo.clean(base, dest)  # already gone: fine
    assert deviceinfo.load(dest) is None


def test_device_info_clean_stays_inside_the_cni_dir(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.write_text("{}")
    deviceinfo.clean(str(tmp_path / "devinfo"), outside)
    assert outside.exists()


def test_malformed_device_info_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("[1]")
    with pytest.raises(CNIError, match="not a JSON object"):
        deviceinfo.load(bad)
