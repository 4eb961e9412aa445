"""Bad input, end to end: each case execs the installed `plexus` exactly as a runtime does.

Every case must fail with one CNI error object on stdout (the spec's code, the config's
cniVersion, a message naming the problem), without a traceback anywhere, and must leave
nothing behind: the pod netns holds only `lo`, host-local holds no IP, and no attachment
record or cached result remains. Cases that fail only after the default network (bridge
+ host-local on eth0) was attached also prove the rollback.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from cni.version import CURRENT_VERSION
from tests.netns.conftest import Node

CID = "c-bad"
POD = "p"
ERROR_KEYS = {"cniVersion", "code", "msg", "details"}
DEFAULT_NETWORK_ANNOTATION = "v1.multus-cni.io/default-network"


@dataclass(frozen=True)
class Case:
    """One bad call and the error it must produce."""

    id: str
    code: int
    msg: str  # a substring of the error's msg naming the problem
    details: str = ""  # a substring of its details, where the specifics live there
    verb: str = "ADD"
    env: Mapping[str, str | None] = field(default_factory=dict)  # overrides; None unsets
    conf: Callable[[Node], dict[str, Any]] | None = None  # stdin config (default: node.meta())
    raw: Callable[[Node], str] | None = None  # stdin as is, instead of a config
    networks: str | list[dict[str, Any]] | None = None  # the pod's networks annotation
    annotations: Mapping[str, str] = field(default_factory=dict)


def _without(conf: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in conf.items() if k != key}


def _args(pod: str = POD, uid: str = f"uid-{POD}") -> str:
    """CNI_ARGS as kubelet's runtime sends them."""
    return (
        f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};"
        f"K8S_POD_INFRA_CONTAINER_ID={CID};K8S_POD_UID={uid}"
    )


POD_ARGS = _args()


def _macvlan(**fields: Any) -> dict[str, Any]:
    """A JSON-form selection of the macvlan-net NAD."""
    return {"name": "macvlan-net", **fields}


NESTED = "[" * 100_000 + "]" * 100_000
"""JSON nested 100,000 levels: Python's own decoder dies of RecursionError on it."""


def _deep_stdin(node: Node) -> str:
    """The node's meta config with a deeply nested value (json.dumps cannot write one)."""
    return json.dumps(node.meta())[:-1] + f', "x": {NESTED}}}'


CASES = [
    # -- stdin --------------------------------------------------------------------------
    Case("garbage-stdin", 6, "network config on stdin: invalid JSON", raw=lambda n: "{not json"),
    Case("empty-stdin", 6, "network config on stdin: invalid JSON", raw=lambda n: ""),
    Case("stdin-a-list", 6, "must be a JSON object", raw=lambda n: "[1, 2]"),
    Case("stdin-a-string", 6, "must be a JSON object", raw=lambda n: '"plexus"'),
    Case(
        "stdin-nested-100000-levels",
        6,
        "network config on stdin is nested deeper than 64 levels",
        raw=_deep_stdin,
    ),
    Case("config-without-name", 7, "no 'name'", conf=lambda n: _without(n.meta(), "name")),
    Case(
        "stdin-over-8MiB",
        6,
        "config on stdin is too large",
        conf=lambda n: n.meta(padding="x" * (9 << 20)),
    ),
    # -- the CNI_* environment (cni/env.py) -------------------------------------------
    Case("no-CNI_COMMAND", 4, "CNI_COMMAND is unset", env={"CNI_COMMAND": None}),
    Case("unknown-CNI_COMMAND", 4, "unknown CNI_COMMAND 'FROB'", env={"CNI_COMMAND": "FROB"}),
    Case("no-CNI_CONTAINERID", 4, "CNI_CONTAINERID is unset", env={"CNI_CONTAINERID": None}),
    Case(
        "bad-CNI_CONTAINERID",
        4,
        "invalid CNI_CONTAINERID '-bad/id'",
        env={"CNI_CONTAINERID": "-bad/id"},
    ),
    Case(
        "DEL-bad-CNI_CONTAINERID",
        4,
        "invalid CNI_CONTAINERID 'a b'",
        verb="DEL",
        env={"CNI_CONTAINERID": "a b"},
    ),
    Case("ADD-without-CNI_NETNS", 4, "CNI_NETNS is unset", env={"CNI_NETNS": None}),
    Case("no-CNI_IFNAME", 4, "CNI_IFNAME is unset", env={"CNI_IFNAME": None}),
    Case("ifname-16-chars", 4, "longer than 15 bytes", env={"CNI_IFNAME": "a" * 16}),
    Case("ifname-dot", 4, 'interface name "." is not allowed', env={"CNI_IFNAME": "."}),
    Case("ifname-slash", 4, 'must not contain "/"', env={"CNI_IFNAME": "eth/0"}),
    Case("ifname-all", 4, 'interface name "all" is not allowed', env={"CNI_IFNAME": "all"}),
    Case(
        "ifname-default",
        4,
        'interface name "default" is not allowed (the kernel reserves it)',
        env={"CNI_IFNAME": "default"},
    ),
    Case(
        "CNI_CONTAINERID-longer-than-a-file-name",
        4,
        "256 bytes, more than the 255 a file name may have",
        env={"CNI_CONTAINERID": "c" * 256},
    ),
    Case("ifname-whitespace", 4, '"eth 0" must not contain', env={"CNI_IFNAME": "eth 0"}),
    Case(
        "CHECK-ifname-colon",
        4,
        '"eth:0" must not contain',
        verb="CHECK",
        env={"CNI_IFNAME": "eth:0"},
    ),
    Case("no-CNI_PATH", 4, "CNI_PATH is unset", env={"CNI_PATH": None}),
    Case("GC-without-CNI_PATH", 4, "CNI_PATH is unset", verb="GC", env={"CNI_PATH": None}),
    Case(
        "CNI_ARGS-malformed-pair",
        4,
        "invalid CNI_ARGS element 'garbage'",
        env={"CNI_ARGS": f"{POD_ARGS};garbage"},
    ),
    # -- versions ------------------------------------------------------------------------
    Case(
        "cniVersion-2.0.0",
        1,
        "incompatible CNI versions",
        details="2.0.0",
        conf=lambda n: n.meta(cniVersion="2.0.0"),
    ),
    Case(
        "cniVersion-junk", 6, "invalid CNI version 'abc'", conf=lambda n: n.meta(cniVersion="abc")
    ),
    Case(
        "cniVersion-a-number",
        7,
        "'cniVersion' must be a string",
        conf=lambda n: n.meta(cniVersion=1),
    ),
    Case(
        "cniVersion-missing",
        7,
        "invalid plexus config",
        details="cniVersion: Field required",
        conf=lambda n: _without(n.meta(), "cniVersion"),
    ),
    Case(
        "STATUS-with-cniVersion-0.4.0",
        1,
        "config version 0.4.0 does not allow STATUS",
        verb="STATUS",
        conf=lambda n: n.meta(cniVersion="0.4.0"),
    ),
    Case(
        "CHECK-with-cniVersion-0.3.1",
        1,
        "config version 0.3.1 does not allow CHECK",
        verb="CHECK",
        conf=lambda n: n.meta(cniVersion="0.3.1"),
    ),
    Case(
        "NAD-cniVersion-2.0.0",
        1,
        "ADD of default/v2-net (net1, macvlan) failed: incompatible CNI versions",
        networks="v2-net",
    ),
    # -- the meta config --------------------------------------------------------------
    Case(
        "no-delegates-no-clusterNetwork",
        7,
        "set clusterNetwork or at least one entry in delegates",
        conf=lambda n: n.meta(delegates=[]),
    ),
    Case(
        "unknown-logLevel",
        7,
        "invalid plexus config",
        details="unknown logLevel 'loud'",
        conf=lambda n: n.meta(logLevel="loud"),
    ),
    Case(
        "clusterNetwork-unknown",
        7,
        "cannot find a network-attachment-definition (nonexistent)",
        conf=lambda n: n.meta(delegates=[], clusterNetwork="nonexistent"),
    ),
    Case(
        "delegate-without-type",
        7,
        "ADD of default-net (eth0, ) failed: network configuration has no 'type'",
        conf=lambda n: n.meta(delegates=[_without(n.bridge_conf(), "type")]),
    ),
    Case(
        "delegate-type-with-slash",
        7,
        "has invalid type '../macvlan'",
        networks="slash-type",
    ),
    Case(
        "delegate-type-not-in-CNI_PATH",
        7,
        'failed to find plugin "no-such-plugin"',
        networks="missing-plugin",
    ),
    Case(
        "GC-valid-attachments-not-a-list",
        7,
        "cni.dev/valid-attachments must be a list",
        verb="GC",
        conf=lambda n: n.meta(**{"cni.dev/valid-attachments": "c-bad"}),
    ),
    Case(
        "socketDir-too-long",
        7,
        "socketDir is too long",
        conf=lambda n: n.meta(socketDir="/run/" + "d" * 120),
    ),
    Case(
        "readiness-indicator-missing",
        11,
        "the default network is not ready: /nonexistent/plexus-ready does not exist",
        conf=lambda n: n.meta(readinessindicatorfile="/nonexistent/plexus-ready"),
    ),
    # -- the networks annotation (meta/selection.py) --------------------------------------
    Case(
        "annotation-malformed-JSON",
        6,
        "the networks annotation of pod default/p: invalid JSON",
        networks="[{bad",
    ),
    Case(
        "annotation-nested-100000-levels",
        6,
        "the networks annotation of pod default/p is nested deeper than 64 levels",
        networks=NESTED,
    ),
    Case(
        "annotation-more-networks-than-maxNetworksPerPod",
        7,
        "the networks annotation of pod default/p asks for 33 networks; at most 32 are allowed",
        networks=",".join(["macvlan-net"] * 33),
    ),
    Case(
        "annotation-10000-networks",
        7,
        "asks for 10000 networks; at most 3 are allowed (maxNetworksPerPod)",
        conf=lambda n: n.meta(maxNetworksPerPod=3),
        networks=",".join(["macvlan-net"] * 10_000),
    ),
    Case(
        "annotation-JSON-not-a-list",
        7,
        "expected a JSON list of objects, got object",
        networks='{"name": "macvlan-net"}',
    ),
    Case(
        "annotation-element-not-an-object",
        7,
        'element 1 ("macvlan-net"): expected a JSON object, got string',
        networks='["macvlan-net"]',
    ),
    Case(
        "annotation-name-not-DNS-1123",
        7,
        'name "Bad_Name" is not a valid DNS-1123 label',
        networks="Bad_Name",
    ),
    Case(
        "annotation-namespace-not-DNS-1123",
        7,
        'namespace "Bad" is not a valid DNS-1123 label',
        networks=[_macvlan(namespace="Bad")],
    ),
    Case("annotation-two-at-signs", 7, 'more than one "@"', networks="macvlan-net@a@b"),
    Case(
        "annotation-interface-too-long",
        7,
        'interface name "net-0123456789ab" is longer than 15 bytes',
        networks=[_macvlan(interface="net-0123456789ab")],
    ),
    Case(
        "annotation-interface-with-slash",
        7,
        'interface name "net/1" must not contain "/"',
        networks=[_macvlan(interface="net/1")],
    ),
    Case(
        "annotation-duplicate-interface",
        7,
        'interface "net5" is also requested by element 1',
        networks=[_macvlan(interface="net5"), {"name": "macvlan-b", "interface": "net5"}],
    ),
    Case(
        "annotation-interface-is-CNI_IFNAME",
        7,
        "interface eth0 is requested by both default-net and default/macvlan-net",
        networks=[_macvlan(interface="eth0")],
    ),
    Case(
        "annotation-cni-args-not-an-object",
        7,
        "cni-args: Input should be a valid dictionary",
        networks=[_macvlan(**{"cni-args": "x"})],
    ),
    Case(
        "annotation-ips-bad-CIDR",
        7,
        'ips: "10.98.1.300/16" is not an IP address or CIDR',
        networks=[{"name": "caps-net", "ips": ["10.98.1.300/16"]}],
    ),
    Case(
        "annotation-mac-invalid",
        7,
        'mac "02:00:zz:00:00:01" is not a valid hardware address',
        networks=[{"name": "caps-net", "mac": "02:00:zz:00:00:01"}],
    ),
    Case(
        "annotation-mac-multicast",
        7,
        'mac "01:00:5e:00:00:01" is a multicast address (its first octet is odd): not a station',
        networks=[{"name": "caps-net", "mac": "01:00:5e:00:00:01"}],
    ),
    Case(
        "annotation-mac-all-zeros",
        7,
        'mac "00:00:00:00:00:00" is all zeros: not a station address',
        networks=[{"name": "caps-net", "mac": "00:00:00:00:00:00"}],
    ),
    Case(
        "annotation-mac-broadcast",
        7,
        'mac "ff:ff:ff:ff:ff:ff" is the broadcast address',
        networks=[_macvlan(mac="ff:ff:ff:ff:ff:ff")],
    ),
    Case(
        "annotation-interface-all",
        7,
        'interface name "all" is not allowed (the kernel reserves it)',
        networks=[_macvlan(interface="all")],
    ),
    Case(
        "annotation-interface-default",
        7,
        'interface name "default" is not allowed',
        networks="macvlan-net@default",
    ),
    Case(
        "annotation-infiniband-guid-invalid",
        7,
        'infiniband-guid "xx" is not a valid hardware address',
        networks=[_macvlan(**{"infiniband-guid": "xx"})],
    ),
    Case(
        "annotation-default-route-not-an-IP",
        7,
        'default-route: "gw" is not an IP address',
        networks=[_macvlan(**{"default-route": ["gw"]})],
    ),
    Case(
        "two-IPv4-default-routes",
        7,
        "default-route: more than one IPv4 gateway requested",
        networks=[
            _macvlan(**{"default-route": ["10.98.0.1"]}),
            {"name": "macvlan-b", "default-route": ["10.97.0.1"]},
        ],
    ),
    Case(
        "portMappings-without-the-capability",
        2,
        "the pod asks for portMappings but no plugin",
        networks=[_macvlan(portMappings=[{"hostPort": 8080, "containerPort": 80}])],
    ),
    Case(
        "default-network-annotation-two-networks",
        7,
        f"{DEFAULT_NETWORK_ANNOTATION} must name exactly one network",
        annotations={DEFAULT_NETWORK_ANNOTATION: "macvlan-net,macvlan-b"},
    ),
    Case(
        "default-network-annotation-nested-100000-levels",
        6,
        f"the {DEFAULT_NETWORK_ANNOTATION} annotation of pod default/p is nested deeper than 64",
        annotations={DEFAULT_NETWORK_ANNOTATION: NESTED},
    ),
    Case(
        "default-network-annotation-other-namespace-with-namespaceIsolation",
        7,
        "pod default/p may not use network other/macvlan-net: namespaceIsolation",
        conf=lambda n: n.meta(namespaceIsolation=True),
        annotations={DEFAULT_NETWORK_ANNOTATION: "other/macvlan-net"},
    ),
    # -- NADs (meta/attachments.py) -------------------------------------------------------
    Case(
        "unknown-NAD",
        7,
        "cannot find a network-attachment-definition (default/nope)",
        networks="nope",
    ),
    Case(
        "cross-namespace-NAD-with-namespaceIsolation",
        7,
        "may not use network other/macvlan-net: namespaceIsolation",
        conf=lambda n: n.meta(namespaceIsolation=True),
        networks="other/macvlan-net",
    ),
    Case(
        "NAD-config-malformed-JSON",
        6,
        "network-attachment-definition default/bad-json spec.config: invalid JSON",
        networks="bad-json",
    ),
    Case(
        "NAD-config-nested-100000-levels",
        6,
        "network-attachment-definition default/deep-json spec.config is nested deeper than 64",
        networks="deep-json",
    ),
    Case(
        "NAD-config-name-with-dot-dot",
        7,
        "network default/dotdot-name: its config's name '../x' is not a valid CNI network name",
        networks="dotdot-name",
    ),
    Case(
        "NAD-config-without-type",
        7,
        "network-attachment-definition default/no-type spec.config has neither a 'type'",
        networks="no-type",
    ),
    Case(
        "NAD-macvlan-mac-multicast",
        7,
        'invalid mac: "03:00:00:00:00:01" is a multicast address (its first octet is odd)',
        networks="multicast-mac",
    ),
    Case(
        "NAD-runtimeConfig-mac-broadcast",
        7,
        'invalid runtimeConfig.mac: "ff:ff:ff:ff:ff:ff" is the broadcast address',
        networks="broadcast-runtime-mac",
    ),
    Case(
        "NAD-name-too-long-for-the-result-cache-file",
        7,
        f"network name {'n' * 250!r} is too long to name the result cache file of container",
        networks="long-name",
    ),
    Case(
        "NAD-without-spec-config",
        7,
        "network-attachment-definition default/no-spec has no spec.config",
        networks="no-spec",
    ),
    Case(
        "NAD-conflist-without-plugins",
        7,
        "network configuration list 'no-plugins' has no plugins",
        networks="no-plugins",
    ),
    # -- the pod and the container ------------------------------------------------------
    Case(
        "pod-UID-mismatch",
        3,
        "the runtime's K8S_POD_UID uid-older is not the UID of the pod now stored",
        env={"CNI_ARGS": _args(uid="uid-older")},
    ),
    Case(
        "CHECK-of-an-unknown-container",
        3,
        f"CHECK: no attachment record for container {CID}",
        verb="CHECK",
    ),
    Case(
        "netns-path-does-not-exist",
        3,
        "/run/netns/pxt-no-such-netns",
        env={"CNI_NETNS": "/run/netns/pxt-no-such-netns"},
    ),
]


def _setup(node: Node, case: Case) -> None:
    """The NADs every case may select, and the pod the runtime names in CNI_ARGS."""
    macvlan = node.macvlan_conf()
    node.nad("macvlan-net", macvlan)
    node.nad("macvlan-net", macvlan, namespace="other")
    node.nad("macvlan-b", node.macvlan_conf("10.97.0.0/16"))
    node.nad(
        "caps-net",
        node.macvlan_conf(capabilities={"ips": True, "mac": True}, ipam={"type": "static"}),
    )
    node.nad("v2-net", {**macvlan, "cniVersion": "2.0.0"})
    node.nad("slash-type", {**macvlan, "type": "../macvlan"})
    node.nad("missing-plugin", {**macvlan, "type": "no-such-plugin"})
    node.nad("bad-json", '{"cniVersion": "1.0.0", "type": "macvlan",')
    node.nad("deep-json", '{"cniVersion": "1.0.0", "type": "macvlan", "x": ' + NESTED + "}")
    node.nad("dotdot-name", {**macvlan, "name": "../x"})
    node.nad("multicast-mac", {**macvlan, "mac": "03:00:00:00:00:01"})
    node.nad("broadcast-runtime-mac", {**macvlan, "runtimeConfig": {"mac": "ff:ff:ff:ff:ff:ff"}})
    node.nad("long-name", {**macvlan, "name": "n" * 250})
    node.nad("no-type", _without(macvlan, "type"))
    node.nad("no-spec", "")
    node.nad("no-plugins", {"cniVersion": "1.0.0", "plugins": []})
    node.pod(POD, case.networks, **case.annotations)


def _run(node: Node, case: Case, netns: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """Exec the installed shim in the node netns as a runtime would; also return its stdin."""
    env: dict[str, str] = {
        "PATH": os.environ["PATH"],
        "CNI_COMMAND": case.verb,
        "CNI_CONTAINERID": CID,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(node.bin),
        "CNI_ARGS": POD_ARGS,
    }
    for key, value in case.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    stdin = case.raw(node) if case.raw is not None else json.dumps((case.conf or Node.meta)(node))
    done = subprocess.run(
        ["ip", "netns", "exec", node.name, str(node.bin / "plexus")],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, stdin


def _config_version(stdin: str) -> str:
    """The cniVersion an error must carry: the config's (CNI spec, "Error"), else the newest."""
    try:
        conf = json.loads(stdin)
    except (ValueError, RecursionError):
        return CURRENT_VERSION
    version = conf.get("cniVersion") if isinstance(conf, dict) else None
    return version if isinstance(version, str) and version else CURRENT_VERSION


def _leftovers(node: Node, state: str) -> list[str]:
    directory = node.cni_dir / state
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_fails_cleanly_with_the_spec_error(node: Node, case: Case) -> None:
    _setup(node, case)
    netns = node.pod_netns()

    done, stdin = _run(node, case, netns)

    assert done.returncode != 0, f"succeeded: {done.stdout}"
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    error = json.loads(done.stdout)  # exactly one JSON value, nothing else
    assert isinstance(error, dict) and set(error) <= ERROR_KEYS, done.stdout
    assert error["cniVersion"] == _config_version(stdin)
    assert (error["code"], type(error["msg"])) == (case.code, str), error
    assert case.msg in error["msg"], error
    assert case.details in error.get("details", ""), error
    log = node.root / "plexus.log"
    assert not log.exists() or "Traceback" not in log.read_text()
    assert node.links(netns) == ["lo"]
    assert node.reserved_ips() == []
    assert _leftovers(node, "records") == [] and _leftovers(node, "results") == []


def test_the_table_is_large_and_unique() -> None:
    assert len(CASES) >= 40
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("name", ["../x", "ABSOLUTE"], ids=["dot-dot", "absolute-path"])
def test_a_network_named_like_a_path_writes_nothing_outside_host_locals_data_dir(
    node: Node, name: str
) -> None:
    """host-local keeps its leases in `<dataDir>/<network name>`: a name with `..` or an
    absolute one would put them elsewhere, so it is refused before any plugin runs."""
    name = str(node.root / "elsewhere") if name == "ABSOLUTE" else name
    escaped = (node.ipam / name).resolve()
    node.nad("path-name", node.macvlan_conf(name=name))
    node.pod(POD, "path-name")
    netns = node.pod_netns()

    done, _ = _run(node, Case("path-name", 7, ""), netns)

    error = json.loads(done.stdout)
    assert error["code"] == 7 and "network default/path-name: its config's name" in error["msg"]
    assert not escaped.exists() and not node.ipam.exists()
    assert node.links(netns) == ["lo"]
