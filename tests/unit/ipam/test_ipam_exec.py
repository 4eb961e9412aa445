"""IPAM types other than host-local/static are exec'd like the reference's ipam.ExecAdd."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from delegates.ipam.dispatch import (
    IN_PROCESS,
    ipam_add,
    ipam_check,
    ipam_del,
    ipam_gc,
    runs_in_process,
)

# Logs each call; ADD answers with a 0.2.0 result (converted by the caller), FAIL=1 fails.
PLUGIN = """\
import json, os, sys
conf = json.loads(sys.stdin.read())
env = {k: v for k, v in os.environ.items() if k.startswith("CNI_")}
with open(os.path.join(os.path.dirname(sys.argv[0]), "calls.log"), "a") as f:
    f.write(json.dumps({"env": env, "conf": conf}) + "\\n")
if "FAIL=1" in env.get("CNI_ARGS", ""):
    print(json.dumps({"cniVersion": conf["cniVersion"], "code": 11, "msg": "busy"}))
    sys.exit(1)
if env["CNI_COMMAND"] == "ADD":
    ip4 = {"ip": "192.0.2.7/24", "gateway": "192.0.2.1"}
    print(json.dumps({"cniVersion": "0.2.0", "ip4": ip4}))
"""


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    plugin = tmp_path / "fake-ipam"
    plugin.write_text(f"#!{sys.executable} -I\n{PLUGIN}")
    plugin.chmod(0o755)
    return tmp_path


def cmd(bin_dir: Path, args: tuple[tuple[str, str], ...] = ()) -> CmdArgs:
    return CmdArgs("ADD", "c1", "/run/netns/x", "net1", args, (str(bin_dir),), b"ignored")


def calls(bin_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (bin_dir / "calls.log").read_text().splitlines()]


CONF = {
    "cniVersion": "1.1.0",
    "name": "n",
    "type": "macvlan",
    "runtimeConfig": {"ips": ["192.0.2.7/24"]},
    "ipam": {"type": "fake-ipam", "x": 1},
}


def test_add_passes_conf_and_env_and_converts_result(bin_dir: Path) -> None:
    result = ipam_add(CONF, cmd(bin_dir, (("IgnoreUnknown", "1"),)))
    assert result.cni_version == "1.1.0"
    assert result.to_dict("1.1.0")["ips"] == [{"address": "192.0.2.7/24", "gateway": "192.0.2.1"}]
    (call,) = calls(bin_dir)
    assert call["conf"] == CONF
    assert call["env"] == {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/run/netns/x",
        "CNI_IFNAME": "net1",
        "CNI_ARGS": "IgnoreUnknown=1",
        "CNI_PATH": str(bin_dir),
    }


def test_del_check_gc_verbs(bin_dir: Path) -> None:
    ipam_del(CONF, cmd(bin_dir))
    ipam_check(CONF, cmd(bin_dir))
    ipam_gc(CONF, cmd(bin_dir))
    ipam_gc({**CONF, "cniVersion": "1.0.0"}, cmd(bin_dir))  # older configs get no GC
    assert [c["env"]["CNI_COMMAND"] for c in calls(bin_dir)] == ["DEL", "CHECK", "GC"]


def test_plugin_error_is_passed_on(bin_dir: Path) -> None:
    with pytest.raises(CNIError) as err:
        ipam_add(CONF, cmd(bin_dir, (("FAIL", "1"),)))
    assert (err.value.code, err.value.msg) == (ErrorCode.TRY_AGAIN_LATER, "busy")


def test_missing_plugin_and_missing_type(bin_dir: Path) -> None:
    with pytest.raises(CNIError) as err:
        ipam_add({**CONF, "ipam": {"type": "nope"}}, cmd(bin_dir))
    assert err.value.code == ErrorCode.INVALID_CONFIG
    assert 'failed to find plugin "nope"' in err.value.msg
    bad_confs: list[dict[str, Any]] = [{"name": "n"}, {**CONF, "ipam": {}}, {**CONF, "ipam": "x"}]
    for bad in bad_confs:
        with pytest.raises(CNIError) as err:
            ipam_add(bad, cmd(bin_dir))
        assert err.value.code == ErrorCode.INVALID_CONFIG


@pytest.mark.parametrize("kind", ["host-local", "static"])
def test_exec_types_exec_an_in_process_ipam(kind: str, bin_dir: Path) -> None:
    """An IPAM type listed in exec_types (execDelegates) is exec'd for every verb."""
    (bin_dir / kind).symlink_to(bin_dir / "fake-ipam")
    conf = {
        **CONF,
        "runtimeConfig": {},
        "ipam": {
            "type": kind,
            "dataDir": str(bin_dir / "data"),
            "ranges": [[{"subnet": "198.51.100.0/24"}]],
            "addresses": [{"address": "198.51.100.5/24"}],
        },
    }
    in_process = ipam_add(conf, cmd(bin_dir))
    assert not (bin_dir / "calls.log").exists()
    assert str(in_process.ips[0].address).startswith("198.51.100.")
    assert runs_in_process(kind) and not runs_in_process(kind, {kind})
    exec_types = {kind, "macvlan"}
    result = ipam_add(conf, cmd(bin_dir), exec_types=exec_types)
    assert result.to_dict("1.1.0")["ips"] == [{"address": "192.0.2.7/24", "gateway": "192.0.2.1"}]
    ipam_check(conf, cmd(bin_dir), exec_types=exec_types)
    ipam_gc(conf, cmd(bin_dir), exec_types=exec_types)
    ipam_del(conf, cmd(bin_dir), exec_types=exec_types)
    assert [c["env"]["CNI_COMMAND"] for c in calls(bin_dir)] == ["ADD", "CHECK", "GC", "DEL"]
    assert all(c["conf"] == conf for c in calls(bin_dir))
    ipam_del(conf, cmd(bin_dir), exec_types={"static" if kind == "host-local" else "host-local"})
    assert len(calls(bin_dir)) == 4  # another type listed: still in process


def test_only_host_local_and_static_run_in_process() -> None:
    assert sorted(IN_PROCESS) == ["host-local", "static"]
    assert not runs_in_process("dhcp") and not runs_in_process("whereabouts", ())
