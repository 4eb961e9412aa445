"""sriov config validation and the plugin's paths that need no kernel (fake sysfs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cni import callscope
from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.skel import dispatch
from delegates.builtin import BuiltinExecutor
from delegates.link import PLUGIN_ERROR
from delegates.sriov import SriovPlugin, load_conf
from delegates.vf import ETH_P_8021AD, ETH_P_8021Q, MAX_STATE, cache_path, vf_lock, write_cache
from meta.install import BINARIES

PCI = "0000:01:10.0"
T = TypeVar("T")


def _conf(**extra: Any) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": PCI, **extra}


def _load(**extra: Any) -> Any:
    return load_conf(json.dumps(_conf(**extra)).encode())


def _args(conf: dict[str, Any], command: str = "ADD", cid: str = "cid") -> CmdArgs:
    return CmdArgs(
        command=command,
        container_id=cid,
        netns="/nonexistent/plexus-unit-netns",
        ifname="net1",
        args=(),
        path=("/usr/lib/cni",),
        stdin=json.dumps(conf).encode(),
    )


def test_full_config() -> None:
    conf = _load(
        vlan=100,
        vlanQoS=3,
        vlanProto="802.1ad",
        mac="02-00-00-00-10-01",
        spoofchk="off",
        trust="on",
        link_state="disable",
        min_tx_rate=10,
        max_tx_rate=100,
        ipam={"type": "static"},
        dataDir="/run/x",
    )
    assert (conf.device_id, conf.vlan, conf.qos, conf.proto) == (PCI, 100, 3, ETH_P_8021AD)
    assert (conf.mac, conf.spoofchk, conf.trust, conf.link_state) == ("02:00:00:00:10:01", 0, 1, 2)
    assert (conf.min_tx_rate, conf.max_tx_rate, conf.ipam_type, conf.data_dir) == (
        10,
        100,
        "static",
        "/run/x",
    )


def test_only_requested_settings_are_wanted() -> None:
    saved = {"rate": [5, 0]}
    assert _load().wanted(saved) == ({}, {})
    want, labels = _load(vlan=7, max_tx_rate=100).wanted(saved)
    assert want == {"vlan": [7, 0, ETH_P_8021Q], "rate": [5, 100]}
    assert labels["rate"] == "max_tx_rate"


@pytest.mark.parametrize(
    "raw",
    [
        {"pciBusID": PCI},
        {"runtimeConfig": {"deviceID": PCI}},
        {"runtimeConfig": {"pciBusID": PCI}},
        {"pciBusID": "01:10.0"},
    ],
)
def test_device_id_sources(raw: dict[str, Any]) -> None:
    stdin = json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "sriov", **raw}).encode()
    assert load_conf(stdin).device_id == PCI


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"deviceID": None}, "deviceID"),
        ({"deviceID": "eth0"}, "deviceID"),
        ({"vlan": 4095}, "vlan"),
        ({"vlan": "100"}, "vlan"),
        ({"vlan": 1, "vlanQoS": 8}, "vlanQoS"),
        ({"vlanQoS": 1}, "vlanQoS"),
        ({"vlanProto": "802.1ad"}, "vlanProto"),
        ({"vlan": 1, "vlanProto": "qinq"}, "vlanProto"),
        ({"mac": "02:00:00:00:10"}, "mac"),
        ({"spoofchk": True}, "spoofchk"),
        ({"trust": "yes"}, "trust"),
        ({"link_state": "up"}, "link_state"),
        ({"min_tx_rate": -1}, "min_tx_rate"),
        ({"min_tx_rate": 200, "max_tx_rate": 100}, "min_tx_rate"),
        ({"ipam": "static"}, "ipam"),
        ({"dataDir": ""}, "dataDir"),
    ],
)
def test_invalid_config_names_the_field(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(CNIError) as info:
        _load(**extra)
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert field in info.value.msg


def test_add_fails_on_bad_config_before_touching_anything(tmp_path: Path) -> None:
    with pytest.raises(CNIError) as info:
        dispatch(SriovPlugin(str(tmp_path)), _args(_conf(vlan=5000, dataDir=str(tmp_path / "d"))))
    assert "vlan" in info.value.msg
    assert not (tmp_path / "d").exists()


def test_add_of_something_that_is_not_a_vf(tmp_path: Path) -> None:
    (tmp_path / "sys/bus/pci/devices" / PCI).mkdir(parents=True)
    data = tmp_path / "d"
    with pytest.raises(CNIError, match="not an SR-IOV VF") as info:
        dispatch(SriovPlugin(str(tmp_path / "sys")), _args(_conf(dataDir=str(data))))
    assert info.value.code == PLUGIN_ERROR
    assert not list(data.glob("*.json"))


def test_add_refuses_a_vf_another_attachment_holds(tmp_path: Path) -> None:
    data = str(tmp_path / "d")
    with vf_lock(data, PCI) as lock:
        lock.set_owner("other-net1")
    (tmp_path / "d" / "other-net1.json").write_text("{}")
    with pytest.raises(CNIError, match="already in use by attachment other-net1"):
        dispatch(SriovPlugin(str(tmp_path)), _args(_conf(dataDir=data)))


def test_del_without_saved_state_succeeds(tmp_path: Path) -> None:
    conf = _conf(dataDir=str(tmp_path / "d"))
    assert dispatch(SriovPlugin(str(tmp_path)), _args(conf, "DEL")) == b""


def test_check_needs_prev_result(tmp_path: Path) -> None:
    with pytest.raises(CNIError, match="prevResult"):
        dispatch(SriovPlugin(str(tmp_path)), _args(_conf(), "CHECK"))


def test_registered_in_process_and_as_a_binary() -> None:
    assert BuiltinExecutor().hosts("sriov")
    assert BINARIES["plexus-sriov"] == "delegates.sriov"


def test_standalone_binary_answers_version() -> None:
    env = {"CNI_COMMAND": "VERSION", "PATH": os.environ.get("PATH", "")}
    code = "from delegates.sriov import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code], input=b"{}", env=env, capture_output=True, check=True
    )
    assert "1.1.0" in json.loads(proc.stdout)["supportedVersions"]


def _rooted(root: str, fn: Callable[[], T]) -> T:
    """fn() in a call whose root (chrootDir) is `root`, within 10 s (a read of a FIFO
    would block for good; the thread is then left behind)."""
    out: list[tuple[bool, Any]] = []

    def run() -> None:
        with callscope.call_scope() as scope:
            scope.root = root
            try:
                out.append((True, fn()))
            except BaseException as exc:  # handed to the test
                out.append((False, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    assert out, "still blocked after 10 s"
    ok, value = out[0]
    if not ok:
        raise value
    result: T = value
    return result


def test_locks_and_state_live_under_the_calls_root(tmp_path: Path) -> None:
    """As host-local's leases: dataDir names a path on the host, seen under chrootDir."""
    host, data = tmp_path / "host", f"/plexus-unit-{tmp_path.name}"
    try:
        with pytest.raises(CNIError, match="already in use by attachment other-net1"):
            _rooted(str(host), lambda: _add_held_by_other(tmp_path / "sys", data))
        assert sorted(p.name for p in Path(f"{host}{data}").iterdir()) == [
            f"{PCI}.lock",
            "other-net1.json",
        ]
        assert not Path(data).exists()
    finally:
        shutil.rmtree(data, ignore_errors=True)  # where it went when the root was ignored


def _add_held_by_other(sysfs: Path, data: str) -> bytes:
    with vf_lock(data, PCI) as lock:
        lock.set_owner("other-net1")
    write_cache(cache_path(data, "other-net1"), {})
    return dispatch(SriovPlugin(str(sysfs)), _args(_conf(dataDir=data)))


def test_a_lock_file_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "d" / f"{PCI}.lock").symlink_to(victim)
    with pytest.raises(CNIError) as info:
        dispatch(SriovPlugin(str(tmp_path)), _args(_conf(dataDir=str(tmp_path / "d"))))
    assert (info.value.code, info.value.msg) == (
        ErrorCode.IO_FAILURE,
        f"cannot open the VF lock {tmp_path}/d/{PCI}.lock",
    )
    assert "not a regular file" in info.value.details
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("kind", ["fifo", "symlink", "big"])
def test_saved_state_that_is_not_a_small_regular_file_is_ignored(tmp_path: Path, kind: str) -> None:
    """DEL reads the attachment's saved state: a FIFO there would block it, a symlink
    would have it read (and then remove) something else's."""
    (tmp_path / "d").mkdir()
    state = tmp_path / "d" / "cid-net1.json"
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"pci": PCI, "netns": "/nonexistent"}))
    if kind == "fifo":
        os.mkfifo(state)
    elif kind == "symlink":
        state.symlink_to(elsewhere)
    else:
        state.write_text(json.dumps({"pci": PCI, "pad": "x" * MAX_STATE}))
    conf = _conf(dataDir=str(tmp_path / "d"))
    plugin = SriovPlugin(str(tmp_path))
    assert _rooted("", lambda: dispatch(plugin, _args(conf, "DEL"))) == b""
    assert state.is_symlink() or state.exists()
    assert not (tmp_path / "d" / f"{PCI}.lock").exists()  # it did not act on any of it


def test_a_container_id_too_long_to_name_the_state_is_refused_first(tmp_path: Path) -> None:
    cid = "c" * 250  # "<cid>-net1.json" is 260 bytes
    with pytest.raises(CNIError) as info:
        dispatch(SriovPlugin(str(tmp_path)), _args(_conf(dataDir=str(tmp_path / "d")), cid=cid))
    assert info.value.code == ErrorCode.INVALID_ENV
    assert info.value.msg.startswith(f"CNI_CONTAINERID {cid!r} is too long to name the saved")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("where", ["mac", "runtimeConfig"])
def test_a_mac_no_station_may_have_is_refused_first(tmp_path: Path, where: str) -> None:
    mac = "01:00:5e:00:00:01"
    extra: dict[str, Any] = {"mac": mac} if where == "mac" else {"runtimeConfig": {"mac": mac}}
    conf = _conf(dataDir=str(tmp_path / "d"), **extra)
    with pytest.raises(CNIError) as info:
        dispatch(SriovPlugin(str(tmp_path)), _args(conf))
    assert (info.value.code, info.value.msg) == (
        ErrorCode.INVALID_CONFIG,
        f'invalid sriov config: mac "{mac}" is a multicast address (its first octet is odd): '
        "not a station address",
    )
    assert not (tmp_path / "d").exists()
    assert dispatch(SriovPlugin(str(tmp_path)), _args(conf, "DEL")) == b""
