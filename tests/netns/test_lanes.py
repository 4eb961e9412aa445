"""Plexus's own delegates attach beside the exec'd default network (meta/lanes.py).

The default network here is the reference bridge chained with `waitfor`, a test plugin
(a fake standing in for a slow default network) that holds the ADD until a link of the
pod exists, up to a limit, and fails if it never does: the ADD can only succeed if the
in-process macvlan attaches while the default network's exec is still running.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.netns.conftest import Node

WAIT_LIMIT = 20
"""Seconds `waitfor` waits for the link before failing the ADD."""


def waiting_default_network(node: Node, link: str) -> dict[str, Any]:
    """bridge + `waitfor`, which returns the bridge's result once `link` is in the pod."""
    plugin: Path = node.bin / "waitfor"
    plugin.write_text(
        "#!/bin/sh\n"
        "input=$(cat)\n"
        'if [ "$CNI_COMMAND" = ADD ]; then\n'
        f'  n=0; until nsenter --net="$CNI_NETNS" ip link show {link} >/dev/null 2>&1; do\n'
        f"    n=$((n+1)); [ $n -gt {WAIT_LIMIT * 20} ] && "
        f'{{ echo \'{{"code": 11, "msg": "{link} never appeared"}}\'; exit 1; }}\n'
        "    sleep 0.05\n"
        "  done\n"
        '  echo "$input" | python3 -c '
        "'import json,sys; print(json.dumps(json.load(sys.stdin)[\"prevResult\"]))'\n"
        "fi\n"
    )
    plugin.chmod(0o755)
    bridge = node.bridge_conf()
    return {
        "cniVersion": "1.0.0",
        "name": bridge.pop("name"),
        "plugins": [bridge, {"type": "waitfor"}],
    }


def test_an_in_process_macvlan_attaches_while_the_default_network_runs(node: Node) -> None:
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("web", "macvlan-net")
    netns = node.pod_netns()
    conf = node.meta(delegates=[waiting_default_network(node, "net1")])

    result = node.ok("ADD", netns=netns, cid="c-web", pod="web", conf=conf)

    assert result is not None
    assert node.links(netns) == ["eth0", "lo", "net1"]
    status = node.network_status("web")
    assert [(s["name"], s["interface"]) for s in status] == [
        ("default-net", "eth0"),
        ("default/macvlan-net", "net1"),
    ]
    node.ok("DEL", netns=netns, cid="c-web", pod="web", conf=conf)
    assert node.links(netns) == ["lo"]
    assert node.reserved_ips() == []


def test_a_macvlan_failing_beside_the_default_network_rolls_both_back(node: Node) -> None:
    node.nad("broken-net", node.macvlan_conf(master="nosuchlink0"))
    node.pod("web", "broken-net")
    netns = node.pod_netns()

    error = node.error("ADD", netns=netns, cid="c-web", pod="web")

    assert "nosuchlink0" in error["msg"] + error.get("details", "")
    assert node.links(netns) == ["lo"]
    assert node.reserved_ips() == []
