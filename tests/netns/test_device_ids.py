"""NADs with a resourceName through the installed binary: device IDs from a fake kubelet.

The delegate is a recorder plugin (a script that logs each stdin it gets and returns a
result), so the injected `deviceID`/`pciBusID` can be observed without SR-IOV hardware.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from meta.sources.base import RESOURCE_NAME_ANNOTATION
from tests.kubelet import serve
from tests.netns.conftest import Node

SRIOV = "intel.com/sriov_a"
VFS = ["0000:3b:02.2", "0000:3b:02.1"]

RECORDER = f"""#!{sys.executable} -IS
import json, os, sys
conf = json.load(sys.stdin)
cmd = os.environ["CNI_COMMAND"]
with open(conf["record"], "a") as log:
    log.write(json.dumps({{"cmd": cmd, "ifname": os.environ.get("CNI_IFNAME"), "conf": conf}}))
    log.write("\\n")
if cmd == "ADD":
    if conf.get("fail"):
        print(json.dumps({{"cniVersion": conf["cniVersion"], "code": 100, "msg": "told to"}}))
        sys.exit(1)
    print(json.dumps(conf.get("prevResult") or {{
        "cniVersion": conf["cniVersion"],
        "interfaces": [{{"name": os.environ["CNI_IFNAME"], "mac": "02:00:00:00:00:01",
                        "sandbox": os.environ["CNI_NETNS"]}}],
        "ips": [{{"address": conf["address"], "interface": 0}}],
    }}))
elif cmd == "VERSION":
    print(json.dumps({{"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0"]}}))
"""


@pytest.fixture
def recorder(node: Node) -> Path:
    script = node.bin / "recorder"
    script.write_text(RECORDER)
    script.chmod(0o755)
    return node.root / "recorded.jsonl"


def _vf_nad(node: Node, name: str, record: Path, address: str, **extra: Any) -> None:
    plugin = {"type": "recorder", "record": str(record), "address": address, **extra}
    config = {"cniVersion": "1.0.0", "name": name, "plugins": [plugin, dict(plugin)]}
    node.nad(name, config, annotations={RESOURCE_NAME_ANNOTATION: SRIOV})


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _device_info(devinfo: Path, device: str) -> dict[str, Any]:
    info = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": device}}
    path = devinfo / "dp" / f"{SRIOV.replace('/', '-')}-{device}-device.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info))
    return info


def test_device_ids_from_podresources_and_device_info(node: Node, recorder: Path) -> None:
    devinfo = node.root / "devinfo"
    sock = node.root / "kubelet.sock"
    conf = node.meta(podResourcesSocket=str(sock), deviceInfoDir=str(devinfo))
    _vf_nad(node, "vf-a", recorder, "10.77.0.5/24", capabilities={"CNIDeviceInfoFile": True})
    _vf_nad(node, "vf-b", recorder, "10.78.0.5/24")
    node.pod("dpdk", "vf-a, vf-b")
    info = _device_info(devinfo, "0000:3b:02.1")  # vf-b's device has none
    netns = node.pod_netns()

    with serve(sock, {("default", "dpdk"): {"app": {SRIOV: VFS}}}) as kubelet:
        node.ok("ADD", netns=netns, cid="c-dpdk", pod="dpdk", conf=conf)
    assert kubelet.calls == 1

    adds = [r for r in _records(recorder) if r["cmd"] == "ADD"]
    seen = [(r["ifname"], r["conf"]["deviceID"], r["conf"]["pciBusID"]) for r in adds]
    assert seen == [
        ("net1", "0000:3b:02.1", "0000:3b:02.1"),
        ("net1", "0000:3b:02.1", "0000:3b:02.1"),
        ("net2", "0000:3b:02.2", "0000:3b:02.2"),
        ("net2", "0000:3b:02.2", "0000:3b:02.2"),
    ]
    copy = devinfo / "cni" / "vf-a-c-dpdk_net1"
    assert adds[0]["conf"]["runtimeConfig"] == {"CNIDeviceInfoFile": str(copy)}
    assert "runtimeConfig" not in adds[2]["conf"]
    assert json.loads(copy.read_text()) == info

    status = {s["name"]: s for s in node.network_status("dpdk")}
    assert status["default/vf-a"]["device-info"] == info
    assert status["default/vf-a"]["ips"] == ["10.77.0.5"]
    assert "device-info" not in status["default/vf-b"]

    node.ok("DEL", netns=netns, cid="c-dpdk", pod="dpdk", conf=conf)
    dels = [r for r in _records(recorder) if r["cmd"] == "DEL"]
    assert [r["conf"]["deviceID"] for r in dels] == ["0000:3b:02.2"] * 2 + ["0000:3b:02.1"] * 2
    assert not copy.exists()
    assert (devinfo / "dp").exists()


def test_checkpoint_fallback_no_device_left_and_rollback(node: Node, recorder: Path) -> None:
    devinfo = node.root / "devinfo"
    checkpoint = node.root / "kubelet_internal_checkpoint"
    entries = [
        {
            "PodUID": "uid-one",
            "ContainerName": "app",
            "ResourceName": SRIOV,
            "DeviceIDs": {"0": VFS},
        }
    ]
    checkpoint.write_text(json.dumps({"Data": {"PodDeviceEntries": entries}, "Checksum": 1}))
    conf = node.meta(
        podResourcesSocket=str(node.root / "no-kubelet.sock"),
        deviceCheckpointFile=str(checkpoint),
        deviceInfoDir=str(devinfo),
    )
    _vf_nad(node, "vf", recorder, "10.77.0.5/24")
    _vf_nad(node, "vf-broken", recorder, "10.78.0.5/24", fail=True)
    _device_info(devinfo, "0000:3b:02.1")
    netns = node.pod_netns()

    node.pod("one", "vf, vf, vf")
    error = node.error("ADD", netns=netns, cid="c-one", pod="one", conf=conf)
    assert error["msg"] == (
        f"network default/vf: no {SRIOV} device left for pod default/one "
        f"(allocated: 0000:3b:02.1, 0000:3b:02.2; 2 taken by earlier networks)"
    )
    assert not recorder.exists()  # nothing ran

    node.pod("one", "vf, vf-broken")
    error = node.error("ADD", netns=netns, cid="c-one", pod="one", conf=conf)
    assert "told to" in error["msg"]
    adds = [r["conf"]["deviceID"] for r in _records(recorder) if r["cmd"] == "ADD"]
    assert adds == ["0000:3b:02.1", "0000:3b:02.1", "0000:3b:02.2"]
    assert list((devinfo / "cni").iterdir()) == []  # rolled back
