"""`plexus deviceplugin` as a process, woken by real kernel events.

The host has no SR-IOV, so the PCI side is a FAKE sysfs tree; but its PF's netdev
directory is a symlink to the real /sys/class/net entry of the node's veth `uplink0`,
and the plugin runs in the node's netns (`ip netns exec` remounts /sys there). Setting
that veth down is a real link event, so this checks the rtnetlink path end to end:
no test-side nudging. Real VFs are in the VM tier (tests/vm/guest/test_dp_server.py).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.kubelet import deviceplugin_pb2 as pb
from deviceplugin.plugin import socket_name
from tests.kubelet import next_until, plugin_stub, serve_registration
from tests.netns.conftest import Node, sh
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

pytestmark = pytest.mark.netns

PF = "0000:3b:00.0"
VFS = ["0000:3b:02.0", "0000:3b:02.1"]
RESOURCE = "intel.com/uplink_vfs"
PLEXUS = Path(sys.executable).with_name("plexus")


@pytest.fixture
def plugins_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="pxdp-"))  # unix socket paths must be short
    yield base
    shutil.rmtree(base)


def _fake_host(root: Path, pf_netdev: str) -> Path:
    sysfs = FakeSysfs(root)
    sysfs.add_pf(PF, pf_netdev, real_netdev=True)
    for i, addr in enumerate(VFS):
        sysfs.add_vf(PF, i, addr, netdev=f"{pf_netdev}v{i}")
    return sysfs.root


def test_link_down_turns_vfs_unhealthy_via_kernel_events(
    node: Node, tmp_path: Path, plugins_dir: Path
) -> None:
    sysfs_root = _fake_host(tmp_path / "sys", node.uplink)
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "resourceList": [
                    {"resourceName": "uplink_vfs", "selectors": {"pfNames": [node.uplink]}}
                ]
            }
        )
    )
    stderr = tmp_path / "dp.log"
    with serve_registration(plugins_dir / "kubelet.sock") as kubelet, stderr.open("w") as log:
        proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                node.name,
                str(PLEXUS),
                "deviceplugin",
                "--config",
                str(config),
                "--sysfs-root",
                str(sysfs_root),
                "--plugins-dir",
                str(plugins_dir),
                "--devinfo-dir",
                str(tmp_path / "devinfo"),
            ],
            stderr=log,
        )
        try:
            (request,) = kubelet.wait_for(1, timeout=30)
            assert (request.resource_name, request.endpoint) == (RESOURCE, socket_name(RESOURCE))
            with plugin_stub(plugins_dir / socket_name(RESOURCE)) as stub:
                stream = stub.ListAndWatch(pb.Empty(), timeout=60)
                healthy = {a: ("Healthy", [0]) for a in VFS}
                assert next_until(stream, lambda d: True) == healthy

                started = time.monotonic()
                sh("ip", "link", "set", node.uplink, "down", netns=node.name)
                found = next_until(stream, lambda d: d[VFS[0]][0] == "Unhealthy")
                print(f"link down reported after {(time.monotonic() - started) * 1000:.0f} ms")
                assert found == {a: ("Unhealthy", [0]) for a in VFS}

                sh("ip", "link", "set", node.uplink, "up", netns=node.name)
                assert next_until(stream, lambda d: d[VFS[0]][0] == "Healthy") == healthy
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=15)
    assert code == 0, stderr.read_text()
    assert not (plugins_dir / socket_name(RESOURCE)).exists()
    assert "registered with the kubelet" in stderr.read_text()


def test_bad_config_exits_2_with_the_field_named(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"resourceList": [{"resourceName": "-ab", "selectors": {}}]}))
    proc = subprocess.run(
        [str(PLEXUS), "deviceplugin", "--config", str(config)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "resourceList[0].resourceName" in proc.stderr and "Traceback" not in proc.stderr
