"""The command line: replay a CNI call by hand, and the demo end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.netns.conftest import Node, sh

PLEXUS = str(Path(sys.executable).parent / "plexus")


def test_replay_add_check_del_with_a_reference_plugin(node: Node, tmp_path: Path) -> None:
    conf = tmp_path / "m.conf"
    conf.write_text(json.dumps({**node.macvlan_conf(), "name": "by-hand"}))
    netns = node.pod_netns()
    base = ["ip", "netns", "exec", node.name, PLEXUS, "cni"]
    opts = [
        "--conf",
        str(conf),
        "--netns",
        netns,
        "--ifname",
        "net9",
        "--path",
        str(node.bin),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]

    added = subprocess.run([*base, "add", *opts], capture_output=True, text=True)

    assert added.returncode == 0, added.stderr
    result = json.loads(added.stdout)
    assert result["interfaces"][0]["name"] == "net9"
    assert '"plugin": "macvlan"' in added.stderr  # the log line of the plugin call
    assert "ADD of by-hand" in added.stderr
    cached = list((tmp_path / "cache" / "results").iterdir())
    assert [p.name.startswith("by-hand-cnitool-") for p in cached] == [True]

    checked = subprocess.run([*base, "check", *opts], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout
    deleted = subprocess.run([*base, "del", *opts], capture_output=True, text=True)
    assert deleted.returncode == 0, deleted.stdout
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []


def test_replay_prints_the_plugin_error(node: Node, tmp_path: Path) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text(json.dumps({**node.macvlan_conf(master="nope0"), "name": "bad"}))
    done = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            node.name,
            PLEXUS,
            "cni",
            "add",
            "--conf",
            str(conf),
            "--netns",
            node.pod_netns(),
            "--path",
            str(node.bin),
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    error = json.loads(done.stdout)
    assert error["code"] == 999 and error["msg"] == 'plugin "macvlan" failed (add): Link not found'


def test_demo_runs_end_to_end() -> None:
    done = subprocess.run([PLEXUS, "demo"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo passed" in done.stdout
    assert sh("ip", "netns", "list").stdout.count("plexus-demo") == 0


def test_logs_have_one_line_per_step_with_identity_and_timing(node: Node) -> None:
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("logged", "macvlan-net")
    node.ok("ADD", netns=node.pod_netns(), cid="c-logged", pod="logged")

    lines = [json.loads(line) for line in (node.root / "plexus.log").read_text().splitlines()]
    steps = [line for line in lines if line["msg"] == "delegate add"]
    assert [(s["network"], s["ifname"], s["delegate"]) for s in steps] == [
        ("default-net", "eth0", "bridge"),
        ("default/macvlan-net", "net1", "macvlan"),
    ]
    for step in steps:
        assert step["cid"] == "c-logged" and step["pod"] == "default/logged"
        assert step["outcome"] == "ok" and step["ms"] > 0 and step["ips"]
    assert any(line["msg"] == "write network-status" for line in lines)
