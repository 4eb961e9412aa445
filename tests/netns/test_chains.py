"""The cluster network's chained subdirectory (libcni 1.3's `<confDir>/<network name>/`)
run by the exec'd plugin: the tuning plugin's sysctl on eth0, the user story.

The chain is read from the files at ADD and saved in the attachment record, so CHECK and
DEL run the chain the ADD ran even after the directory changed (a plugin removed, one
that is not installed added); the next ADD reads the directory again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.netns.conftest import Node, sh

SYSCTL = "net.ipv4.conf.eth0.arp_filter"


def _setup(node: Node, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """Plexus's conf with the cluster network read from a conflist file, whose
    subdirectory chains tuning (setting SYSCTL on eth0) after the bridge."""
    net_d = tmp_path / "net.d"
    chain = net_d / "default-net"
    chain.mkdir(parents=True)
    primary = net_d / "10-default.conflist"
    primary.write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "default-net", "plugins": [node.bridge_conf()]})
    )
    tuning = {"type": "tuning", "sysctl": {SYSCTL: "1"}, "dataDir": str(tmp_path / "tuning")}
    (chain / "50-tuning.conf").write_text(json.dumps(tuning))
    conf = node.meta(clusterNetwork=str(primary))
    del conf["delegates"]
    return conf, chain


def _sysctl(netns: str) -> str:
    """SYSCTL in the pod ("" while it has no eth0)."""
    return sh("sysctl", "-n", SYSCTL, netns=Path(netns).name, check=False).stdout.strip()


def _delegate_chains(node: Node, verb: str, cid: str) -> list[str]:
    """The chains the plugin ran for `verb` on `cid`, from its log."""
    lines = [json.loads(line) for line in (node.root / "plexus.log").read_text().splitlines()]
    return [
        line["delegate"]
        for line in lines
        if line.get("verb") == verb.lower()
        and line.get("msg") == f"delegate {verb.lower()}"
        and str(line.get("cid", "")).startswith(cid[:12])
    ]


def test_the_cluster_network_s_subdirectory_is_chained_and_recorded(
    node: Node, tmp_path: Path
) -> None:
    conf, chain = _setup(node, tmp_path)
    node.pod("tuned")
    netns = node.pod_netns()
    assert _sysctl(netns) == ""  # no eth0 yet
    node.ok("ADD", netns=netns, cid="c-tuned", pod="tuned", conf=conf)
    assert _sysctl(netns) == "1"
    assert _delegate_chains(node, "ADD", "c-tuned") == ["bridge+tuning"]

    # The directory changes under the running pod: tuning gone, a plugin that is not
    # installed added. CHECK and DEL still run what the ADD ran.
    (chain / "50-tuning.conf").unlink()
    (chain / "60-missing.conf").write_text(json.dumps({"type": "no-such-plugin"}))
    node.ok("CHECK", netns=netns, cid="c-tuned", pod="tuned", conf=conf)
    node.ok("DEL", netns=netns, cid="c-tuned", pod="tuned", conf=conf)
    node.added.clear()
    assert _delegate_chains(node, "CHECK", "c-tuned") == ["bridge+tuning"]
    assert _delegate_chains(node, "DEL", "c-tuned") == ["bridge+tuning"]
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []

    # A new ADD reads the directory again.
    (chain / "60-missing.conf").unlink()
    node.pod("next")
    netns = node.pod_netns()
    node.ok("ADD", netns=netns, cid="c-next", pod="next", conf=conf)
    assert _sysctl(netns) == "0"
    assert _delegate_chains(node, "ADD", "c-next") == ["bridge"]


def test_load_only_inlined_plugins_leaves_the_subdirectory_out(node: Node, tmp_path: Path) -> None:
    conf, _ = _setup(node, tmp_path)
    primary = Path(conf["clusterNetwork"])
    primary.write_text(
        json.dumps({**json.loads(primary.read_text()), "loadOnlyInlinedPlugins": True})
    )
    node.pod("plain")
    netns = node.pod_netns()
    node.ok("ADD", netns=netns, cid="c-plain", pod="plain", conf=conf)
    assert _sysctl(netns) == "0"
    assert _delegate_chains(node, "ADD", "c-plain") == ["bridge"]
