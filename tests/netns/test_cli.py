"""The command line: replay a CNI call by hand, install-cni, and the demo end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cni.version import SUPPORTED_VERSIONS, parse_version
from meta.install import BINARIES, SHIM_NAME
from tests.netns.conftest import Node, sh

PLEXUS = str(Path(sys.executable).parent / "plexus")
REPO = Path(__file__).resolve().parents[2]
MAC = "02:42:0a:60:04:04"


def _replay(
    node: Node, tmp_path: Path, verb: str, conf: dict[str, Any], *options: str
) -> subprocess.CompletedProcess[str]:
    """`plexus cni VERB --conf FILE ...` in the node netns, with the node's plugins and a
    result cache in tmp_path."""
    path = tmp_path / "replay.conf"
    path.write_text(json.dumps(conf))
    command = [PLEXUS, "cni", verb, "--conf", str(path), "--path", str(node.bin)]
    command += ["--cache-dir", str(tmp_path / "cache"), *options]
    return subprocess.run(
        ["ip", "netns", "exec", node.name, *command],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _ok(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def _error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 1, done.stdout + done.stderr
    error: dict[str, Any] = json.loads(done.stdout)
    return error


def _mac(netns: str, ifname: str) -> str:
    out = sh("ip", "-j", "link", "show", "dev", ifname, netns=Path(netns).name).stdout
    return str(json.loads(out)[0]["address"])


def _plugins_called(stderr: str) -> list[str]:
    """The plugins named by the JSON log lines the replay prints, in order."""
    lines = (json.loads(line) for line in stderr.splitlines() if line.startswith("{"))
    return [str(line["plugin"]) for line in lines if "plugin" in line]


def _cached(tmp_path: Path) -> list[str]:
    results = tmp_path / "cache" / "results"
    return sorted(p.name for p in results.iterdir()) if results.is_dir() else []


def test_replay_add_check_del_with_a_reference_plugin(node: Node, tmp_path: Path) -> None:
    conf = {**node.macvlan_conf(), "name": "by-hand"}
    netns = node.pod_netns()
    where = ("--netns", netns, "--ifname", "net9")

    added = _replay(node, tmp_path, "add", conf, *where)

    result = _ok(added)
    assert result["interfaces"][0]["name"] == "net9"
    assert set(_plugins_called(added.stderr)) == {"macvlan"}  # the log line of the plugin call
    assert "ADD of by-hand" in added.stderr
    assert [p.startswith("by-hand-cnitool-") for p in _cached(tmp_path)] == [True]

    _ok(_replay(node, tmp_path, "check", conf, *where))
    _ok(_replay(node, tmp_path, "del", conf, *where))
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []


def test_replay_prints_the_plugin_error(node: Node, tmp_path: Path) -> None:
    conf = {**node.macvlan_conf(master="nope0"), "name": "bad"}
    error = _error(_replay(node, tmp_path, "add", conf, "--netns", node.pod_netns()))
    assert error["code"] == 999 and error["msg"] == 'plugin "macvlan" failed (add): Link not found'


def test_replay_args_reach_the_ipam_plugin(node: Node, tmp_path: Path) -> None:
    """`IP=` in --args is what the reference static IPAM assigns (CNI_ARGS, not the config)."""
    conf = {**node.macvlan_conf(ipam={"type": "static"}), "name": "static-by-hand"}
    netns = node.pod_netns()
    where = ("--netns", netns, "--ifname", "net9")
    args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=x;IP=10.96.3.7/24"

    result = _ok(_replay(node, tmp_path, "add", conf, *where, "--args", args))

    assert [ip["address"] for ip in result["ips"]] == ["10.96.3.7/24"]
    assert node.addresses(netns, "net9") == ["10.96.3.7"]
    _ok(_replay(node, tmp_path, "del", conf, *where, "--args", args))
    assert node.links(netns) == ["lo"]


def test_replay_args_name_the_pod_for_the_meta_plugin(node: Node, tmp_path: Path) -> None:
    """K8S_POD_* in --args reach the installed plexus, which attaches that pod's networks."""
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("by-hand", "macvlan-net")
    netns = node.pod_netns()
    args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=by-hand;K8S_POD_UID=uid-by-hand"
    call = ("--netns", netns, "--container-id", "c-by-hand", "--args", args)

    _ok(_replay(node, tmp_path, "add", node.meta(), *call))

    assert node.links(netns) == ["eth0", "lo", "net1"]
    statuses = node.network_status("by-hand")
    assert [(s["name"], s["interface"]) for s in statuses] == [
        ("default-net", "eth0"),
        ("default/macvlan-net", "net1"),
    ]
    _ok(_replay(node, tmp_path, "del", node.meta(), *call))
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []


@pytest.mark.parametrize(
    "capabilities",
    [{"ips": True, "mac": True}, {"ips": True, "mac": False}],
    ids=["ips-and-mac-declared", "only-ips-declared"],
)
def test_replay_cap_args_reach_only_declared_capabilities(
    node: Node, tmp_path: Path, capabilities: dict[str, bool]
) -> None:
    conf = {
        **node.macvlan_conf(ipam={"type": "static"}, capabilities=capabilities),
        "name": "caps-by-hand",
    }
    netns = node.pod_netns()
    where = ("--netns", netns, "--ifname", "net9")
    cap_args = json.dumps({"ips": ["10.96.4.4/24"], "mac": MAC})

    result = _ok(_replay(node, tmp_path, "add", conf, *where, "--cap-args", cap_args))

    assert node.addresses(netns, "net9") == ["10.96.4.4"]
    assert (_mac(netns, "net9") == MAC) is capabilities["mac"]
    assert (result["interfaces"][0]["mac"] == MAC) is capabilities["mac"]
    _ok(_replay(node, tmp_path, "check", conf, *where, "--cap-args", cap_args))
    _ok(_replay(node, tmp_path, "del", conf, *where, "--cap-args", cap_args))
    assert node.links(netns) == ["lo"] and _cached(tmp_path) == []


def test_replay_status(node: Node, tmp_path: Path) -> None:
    plexus_macvlan = {**node.macvlan_conf(), "cniVersion": "1.1.0", "type": "plexus-macvlan"}
    ready = _replay(node, tmp_path, "status", {**plexus_macvlan, "name": "st"})
    _ok(ready)
    assert set(_plugins_called(ready.stderr)) == {"plexus-macvlan"}
    assert "STATUS of st" in ready.stderr

    # Below 1.1.0 there is no STATUS verb: nothing runs, as libcni.
    old = _replay(node, tmp_path, "status", {**node.macvlan_conf(), "name": "old"})
    _ok(old)
    assert _plugins_called(old.stderr) == []

    # The meta-plugin is not ready when its default network is not.
    gone = {"cniVersion": "1.1.0", "name": "gone", "type": "no-such-plugin"}
    error = _error(_replay(node, tmp_path, "status", node.meta(delegates=[gone])))
    assert error["code"] == 7
    assert error["msg"].startswith('plugin "plexus" failed (status): ')
    assert 'failed to find plugin "no-such-plugin"' in error["msg"]


def test_replay_gc_deletes_stale_attachments_and_reaches_the_plugin(
    node: Node, tmp_path: Path
) -> None:
    conf = {**node.macvlan_conf(), "cniVersion": "1.1.0", "type": "plexus-macvlan"}
    conf["name"] = "gc-by-hand"
    spaces = {"c-kept": node.pod_netns(), "c-stale": node.pod_netns()}
    for cid, netns in spaces.items():
        _ok(_replay(node, tmp_path, "add", conf, "--netns", netns, "--container-id", cid))
    kept_ip = node.addresses(spaces["c-kept"], "eth0")
    # A lease without a cached result: only GC reaching the plugin can release it.
    (node.ipam / "gc-by-hand" / "10.98.0.200").write_text("c-leaked\r\neth0")
    assert len(node.reserved_ips()) == 3

    done = _replay(node, tmp_path, "gc", conf, "--valid", json.dumps([["c-kept", "eth0"]]))

    _ok(done)
    assert node.links(spaces["c-stale"]) == ["lo"]
    assert node.links(spaces["c-kept"]) == ["eth0", "lo"]
    assert node.reserved_ips() == kept_ip
    assert _cached(tmp_path) == ["gc-by-hand-c-kept-eth0"]

    _ok(_replay(node, tmp_path, "gc", conf, "--valid", "[]"))
    assert node.links(spaces["c-kept"]) == ["lo"] and node.reserved_ips() == []


def test_replay_version(node: Node, tmp_path: Path) -> None:
    conflist = {
        "cniVersion": "1.0.0",
        "name": "versions",
        "plugins": [{"type": "plexus-macvlan"}, {"type": "macvlan"}, {"type": "tuning"}],
    }
    versions = _ok(_replay(node, tmp_path, "version", conflist))
    assert set(versions) == {"plexus-macvlan", "macvlan", "tuning"}
    assert versions["plexus-macvlan"] == {
        "cniVersion": "1.1.0",
        "supportedVersions": list(SUPPORTED_VERSIONS),
    }
    for info in versions.values():
        assert info["cniVersion"] in info["supportedVersions"]
        assert {"0.4.0", "1.0.0"} <= set(info["supportedVersions"])


def test_install_cni_binaries_answer_version_with_only_cni_variables(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    installed = subprocess.run(
        [PLEXUS, "install-cni", "--bin-dir", str(bin_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stderr
    names = {SHIM_NAME, *BINARIES}
    assert installed.stdout.splitlines() == [
        f"installed {bin_dir / n}" for n in [*BINARIES, SHIM_NAME]
    ]
    assert {p.name for p in bin_dir.iterdir()} == names  # no temp files left behind
    # Without a daemon socket the shim runs plexus-thin beside it.
    stdin = json.dumps({"cniVersion": "1.1.0", "socketDir": str(tmp_path / "no-daemon")})

    for name in sorted(names):
        done = subprocess.run(
            [str(bin_dir / name)],
            input=stdin,
            env={"CNI_COMMAND": "VERSION", "CNI_PATH": str(bin_dir)},
            capture_output=True,
            text=True,
            timeout=60,
        )

        assert (done.returncode, done.stderr) == (0, ""), f"{name}: {done.stdout} {done.stderr}"
        info = json.loads(done.stdout)
        assert set(info) == {"cniVersion", "supportedVersions"}, name
        assert info["supportedVersions"] == list(SUPPORTED_VERSIONS), name
        assert info["cniVersion"] == max(info["supportedVersions"], key=parse_version), name


def test_demo_runs_end_to_end() -> None:
    """As `make demo` runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.demo"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo passed" in done.stdout
    assert sh("ip", "netns", "list").stdout.count("plexus-demo") == 0


def test_logs_have_one_line_per_step_with_identity_and_timing(node: Node) -> None:
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("logged", "macvlan-net")
    node.ok("ADD", netns=node.pod_netns(), cid="c-logged", pod="logged")

    lines = [json.loads(line) for line in (node.root / "plexus.log").read_text().splitlines()]
    steps = [line for line in lines if line["msg"] == "delegate add"]
    # The in-process macvlan runs beside the bridge exec, so either may log first.
    assert sorted((s["network"], s["ifname"], s["delegate"], s["lane"]) for s in steps) == [
        ("default-net", "eth0", "bridge", "in order"),
        ("default/macvlan-net", "net1", "macvlan", "beside"),
    ]
    for step in steps:
        assert step["cid"] == "c-logged" and step["pod"] == "default/logged"
        assert step["outcome"] == "ok" and step["ms"] > 0 and step["ips"]
    assert any(line["msg"] == "write network-status" for line in lines)
    (summary,) = [line for line in lines if line["msg"] == "cni add"]
    assert (summary["cid"], summary["pod"], summary["ifname"]) == (
        "c-logged",
        "default/logged",
        "eth0",
    )
    assert summary["outcome"] == "ok" and summary["ms"] >= max(s["ms"] for s in steps)


def test_logs_end_each_call_with_its_outcome_and_error_code(node: Node) -> None:
    node.pod("no-sandbox")
    gone = "/run/netns/plexus-test-no-such-sandbox"
    assert node.error("ADD", netns=gone, cid="c-gone", pod="no-sandbox")["code"] == 3

    lines = [json.loads(line) for line in (node.root / "plexus.log").read_text().splitlines()]
    (summary,) = [line for line in lines if line["msg"] == "cni add"]
    assert (summary["cid"], summary["pod"], summary["netns"]) == (
        "c-gone",
        "default/no-sandbox",
        gone,
    )
    assert (summary["level"], summary["outcome"], summary["code"]) == ("error", "error", 3)
    assert gone in summary["error"]
