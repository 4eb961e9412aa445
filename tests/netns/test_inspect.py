"""`plexus inspect`: the node report against real namespaces, healthy and broken."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.netns.conftest import Node, sh

pytestmark = pytest.mark.netns

PLEXUS = Path(sys.executable).with_name("plexus")


def _inspect(node: Node, *extra: str) -> subprocess.CompletedProcess[str]:
    config = node.root / "plexus.json"
    config.write_text(json.dumps(node.meta()))
    return subprocess.run(
        [str(PLEXUS), "inspect", "--config", str(config), *extra], capture_output=True, text=True
    )


def _report(node: Node) -> tuple[int, dict[str, Any]]:
    done = _inspect(node, "--json")
    return done.returncode, json.loads(done.stdout)


def test_healthy_pod_then_each_kind_of_damage(node: Node) -> None:
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("p", "macvlan-net")
    netns = node.pod_netns()
    node.ok("ADD", netns=netns, cid="c-p", pod="p")

    code, report = _report(node)
    assert code == 0 and report["healthy"], report
    (container,) = report["containers"]
    assert (container["container_id"], container["pod"], container["netns"]) == (
        "c-p",
        "default/p",
        netns,
    )
    eth0, net1 = container["interfaces"]
    assert (eth0["ifname"], eth0["plugins"], eth0["present"]) == ("eth0", ["bridge"], True)
    assert (net1["network"], net1["plugins"]) == ("default/macvlan-net", ["macvlan"])
    (status,) = [e for e in node.network_status("p") if e["interface"] == "net1"]
    assert [ip.split("/")[0] for ip in net1["ips"]] == status["ips"]
    assert net1["mac"] == status["mac"]
    text = _inspect(node).stdout
    assert "container c-p  pod default/p" in text and text.rstrip().endswith("healthy")

    # an address removed behind Plexus's back, then the whole interface
    sh("ip", "addr", "flush", "dev", "net1", netns=Path(netns).name)
    code, report = _report(node)
    (problem,) = report["containers"][0]["interfaces"][1]["problems"]
    assert code == 1 and problem == f"{net1['ips'][0]} is not on net1"
    sh("ip", "link", "del", "net1", netns=Path(netns).name)
    code, report = _report(node)
    assert report["containers"][0]["interfaces"][1]["present"] is False
    assert "net1 is not in the namespace" in report["containers"][0]["interfaces"][1]["problems"][0]

    # the namespace goes away without a DEL: the report says what holds the IPs
    sh("ip", "netns", "del", node.pods.pop())
    code, report = _report(node)
    assert code == 1
    assert report["containers"][0]["netns_exists"] is False
    assert report["containers"][0]["problems"] == [
        "namespace gone: its IPs stay reserved until DEL or GC"
    ]

    node.ok("DEL", netns=netns, cid="c-p", pod="p")
    code, report = _report(node)
    assert code == 0 and report["containers"] == [] and report["orphan_results"] == []


def test_a_result_and_a_lease_without_a_record_are_reported(node: Node) -> None:
    node.pod("q")
    netns = node.pod_netns()
    node.ok("ADD", netns=netns, cid="c-q", pod="q")
    (node.cni_dir / "records" / "c-q").unlink()
    code, report = _report(node)
    assert code == 1 and report["containers"] == []
    assert [Path(p).name for p in report["orphan_results"]] == ["default-net-c-q-eth0"]
    (lease,) = report["orphan_leases"]  # its IP stays reserved: a leak GC would release
    assert (lease["network"], lease["container_id"], lease["ifname"]) == (
        "default-net",
        "c-q",
        "eth0",
    )
    assert lease["data_dir"] == str(node.ipam)
    assert f"{lease['ip']} in {node.ipam}/default-net by c-q (eth0)" in _inspect(node).stdout


def test_bad_config_is_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.json"
    config.write_text("{")
    done = subprocess.run(
        [str(PLEXUS), "inspect", "--config", str(config)], capture_output=True, text=True
    )
    assert (
        done.returncode == 2 and "plexus inspect:" in done.stderr and "Traceback" not in done.stderr
    )
