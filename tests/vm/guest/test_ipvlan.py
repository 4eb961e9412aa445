"""ipvlan against the reference plugin (/usr/lib/cni, 1.1.1), and macvlan/ipvlan on a VLAN.

These need ipvlan, 802.1q and dummy, which the host kernel lacks: they run in the VM
tier (tests/vm/test_guest_suite.py) and skip wherever `ip link add ... type ipvlan`
is not supported. As in tests/netns/test_macvlan_differential.py each case runs in
three fresh worlds: the reference binary, our binary (exec'd) and our in-process plugin
(BuiltinExecutor); a world is a host namespace holding the master (a dummy, or a VLAN
on it) plus a pod namespace. Results must match modulo namespace paths, and so must the
pod's kernel state. CHECK of a broken pod, DEL of what is already gone and bad configs
must fail (or pass) like the reference, with its code and a message related to its as in
the host test, leaving no link or host-local reservation behind.

1.1.1 has no `linkInContainer`: for a master in the pod, the reference runs inside the
pod as a stand-in. Known, deliberate differences from 1.1.1 (asserted as such below):
- ndisc_notify is 1 with IPv6 on our side.
- with `master` omitted (chained: prevResult's interface; else the default route's),
  1.1.1's CHECK looks up master "" and fails; ours checks the pod.
- without `ipam` and without IPs in a prevResult, 1.1.1 creates the link, execs IPAM type
  "" ("no plugin name provided") and leaves the link; ours refuses the config first.
- CHECK's missing-route message spells the route differently.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni.config import load_network_config, plugin_stdin
from cni.env import cni_env
from cni.errors import CNIError
from cni.invoke import ExecExecutor, Executor
from delegates.builtin import BuiltinExecutor
from delegates.netns import run_in_netns
from tests.vm.guest.conftest import REPO

REFERENCE = Path("/usr/lib/cni")
FLAVORS = ("ref", "exec", "inproc")
PREFIX = f"pxip{uuid.uuid4().hex[:6]}"
_LAUNCHER = (
    "#!{python}\nimport sys\nsys.path.insert(0, {repo!r})\nfrom {module} import main\n\nmain()\n"
)


def ip(*args: str, ns: str = "", check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc


@pytest.fixture(scope="module", autouse=True)
def kernel_has_ipvlan() -> Iterator[None]:
    """Skip unless this kernel can create ipvlan (and dummy) links; sweep leftovers after."""
    ns = f"{PREFIX}-probe"
    ip("netns", "add", ns)
    try:
        for args in (("probe0", "type", "dummy"), ("probe1", "link", "probe0", "type", "ipvlan")):
            done = ip("link", "add", *args, ns=ns, check=False)
            if done.returncode != 0:
                pytest.skip(f"kernel cannot `ip link add {' '.join(args)}`: {done.stderr.strip()}")
    finally:
        ip("netns", "del", ns, check=False)
    yield
    for name in ip("netns", "list").stdout.split():
        if name.startswith(PREFIX):
            ip("netns", "del", name, check=False)


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`ipvlan` and `macvlan` are our plugins, every other type the reference's."""
    path = tmp_path_factory.mktemp("bin")
    for plugin in REFERENCE.iterdir():
        (path / plugin.name).symlink_to(plugin)
    for kind in ("ipvlan", "macvlan"):
        (path / kind).unlink()
        text = _LAUNCHER.format(python=sys.executable, repo=str(REPO), module=f"delegates.{kind}")
        (path / kind).write_text(text)
        (path / kind).chmod(0o755)
    return path


MASTER_MAC = "02:70:00:00:00:01"  # every master's, so messages naming a MAC compare across worlds
POD_MASTER = "cmaster0"


class World:
    """Host namespace with `master0` (a dummy, up) and maybe `master0.100`; a pod namespace.

    `default_route`: master0 carries the host's default route. `pod_master`: the pod holds
    its own master, POD_MASTER (linkInContainer); the 1.1.1 reference lacks that option,
    so `call` runs it inside the pod as a stand-in.
    """

    def __init__(
        self,
        tag: str,
        root: Path,
        vlan: bool = False,
        default_route: bool = False,
        pod_master: bool = False,
    ) -> None:
        self.host, self.pod = f"{PREFIX}-{tag}-h", f"{PREFIX}-{tag}-p"
        self.cid = f"{PREFIX}-{tag}"
        self.ipam_dir = str(root / "ipam")
        self.pod_master = pod_master
        for ns in (self.host, self.pod):
            ip("netns", "add", ns)
            ip("link", "set", "lo", "up", ns=ns)
        self._dummy(self.host, "master0")
        if vlan:
            vlan_args = ("link", "master0", "name", "master0.100", "type", "vlan", "id", "100")
            ip("link", "add", *vlan_args, ns=self.host)
            ip("link", "set", "master0.100", "up", ns=self.host)
        if default_route:
            ip("addr", "add", "192.0.2.2/24", "dev", "master0", ns=self.host)
            ip("route", "add", "default", "via", "192.0.2.1", ns=self.host)
        if pod_master:
            self._dummy(self.pod, POD_MASTER)
        # what each namespace holds when no plugin has left anything behind
        self.host_links, self.pod_links = self.links(self.host), self.links(self.pod)

    @staticmethod
    def _dummy(ns: str, name: str) -> None:
        ip("link", "add", name, "address", MASTER_MAC, "type", "dummy", ns=ns)
        ip("link", "set", name, "up", ns=ns)

    @property
    def pod_path(self) -> str:
        return f"/run/netns/{self.pod}"

    def destroy(self) -> None:
        for ns in (self.pod, self.host):
            ip("netns", "del", ns, check=False)

    def links(self, ns: str) -> list[str]:
        return sorted(x["ifname"] for x in json.loads(ip("-j", "link", "show", ns=ns).stdout))

    def reserved_ips(self) -> list[str]:
        files = Path(self.ipam_dir).rglob("*")
        return sorted(p.name for p in files if p.is_file() and p.name[0].isdigit())

    def assert_clean(self) -> None:
        """Nothing left behind: no links beyond the world's own, no host-local reservation."""
        assert self.links(self.host) == self.host_links
        assert self.links(self.pod) == self.pod_links
        assert self.reserved_ips() == []


@pytest.fixture
def worlds(tmp_path: Path) -> Iterator[Callable[..., dict[str, World]]]:
    """make(**World options): one fresh world per flavor."""
    made: list[World] = []

    def make(**opts: bool) -> dict[str, World]:
        out = {}
        for flavor in FLAVORS:
            made.append(World(f"{len(made)}", tmp_path / f"w{len(made)}", **opts))
            out[flavor] = made[-1]
        return out

    yield make
    for world in made:
        world.destroy()


def root_links() -> list[str]:
    """The links of the VM's root namespace (where the test itself runs)."""
    return sorted(x["ifname"] for x in json.loads(ip("-j", "link", "show").stdout))


def call(
    flavor: str,
    bin_dir: Path,
    world: World,
    verb: str,
    conf: dict[str, Any],
    prev: dict[str, Any] | None = None,
    netns: str | None = None,
) -> dict[str, Any] | None:
    """One plugin call on a thread inside the world's host namespace (the reference's inside
    the pod when the pod holds the master); CNI_NETNS is the pod unless `netns` is given."""
    executor: Executor = BuiltinExecutor() if flavor == "inproc" else ExecExecutor(timeout=120)
    path = [str(bin_dir if flavor == "exec" else REFERENCE)]
    net = load_network_config(json.dumps(conf).encode())
    stdin = plugin_stdin(net, net.plugins[0], {}, prev)
    env = cni_env(verb, world.cid, world.pod_path if netns is None else netns, "eth0", (), path)
    where = world.pod if flavor == "ref" and world.pod_master else world.host
    out = run_in_netns(f"/run/netns/{where}", lambda: executor.run(conf["type"], stdin, env))
    assert verb == "ADD" or out == b"", (verb, out)
    return json.loads(out) if verb == "ADD" else None


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """("ok", fn(*args)) or ("error", (code, msg))."""
    try:
        return "ok", fn(*args)
    except CNIError as err:
        return "error", (err.code, err.msg)


def pod_state(world: World) -> dict[str, Any]:
    ns = world.pod
    state: dict[str, Any] = {"links": world.links(ns)}
    if "eth0" not in state["links"]:
        return state
    (link,) = json.loads(ip("-d", "-j", "addr", "show", "dev", "eth0", ns=ns).stdout)
    info = link.get("linkinfo", {})
    state |= {
        "kind": info.get("info_kind"),
        "mode": info.get("info_data", {}).get("mode"),
        "mtu": link["mtu"],
        "flags": sorted(link["flags"]),
        "promiscuity": link.get("promiscuity"),
        "addrs": sorted(
            (a["family"], a["local"], a["prefixlen"], a.get("broadcast"), a.get("scope"))
            for a in link["addr_info"]
            if not a["local"].startswith("fe80")
        ),
    }
    keys = ("type", "dst", "gateway", "dev", "protocol", "scope", "table", "metric")
    routes = []
    for family in ("-4", "-6"):
        out = ip(family, "-d", "-j", "route", "show", "table", "all", ns=ns).stdout
        for r in json.loads(out):
            if not r["dst"].startswith(("fe80", "ff00")) and r.get("dev") != "lo":
                routes.append(tuple(str(r.get(k)) for k in keys))
    state["routes"] = sorted(routes)
    for key in ("ipv4/conf/eth0/arp_notify", "ipv6/conf/eth0/ndisc_notify"):
        cat = ["ip", "netns", "exec", ns, "cat", f"/proc/sys/net/{key}"]
        state[key] = subprocess.run(cat, capture_output=True, text=True).stdout.strip()
    return state


def normalize(value: Any, world: World) -> Any:
    """A result or error with the world's namespaces and (in a result) MACs masked: a
    macvlan's MAC is random."""
    text = json.dumps(value).replace(world.pod_path, "<pod>").replace(world.host, "<host>")
    out = json.loads(text)
    if isinstance(out, dict):
        for iface in out.get("interfaces", []):
            iface["mac"] = "<mac>"
    return out


def assert_errors_match(errors: dict[str, Any], match: str) -> None:
    """Our flavors failed with the reference's code, and a message related to its by
    `match`: equal; contains (ours has the reference's and more); prefix:<text> (both start
    with it); substring:<text> (both contain it); ours:<text> (a deliberate difference: ours
    is exactly <text>, the reference's something else)."""
    ref_code, ref_msg = errors["ref"]
    for flavor in ("exec", "inproc"):
        code, msg = errors[flavor]
        assert code == ref_code, (flavor, errors)
        if match == "equal":
            assert msg == ref_msg, (flavor, errors)
        elif match == "contains":
            assert ref_msg in msg and len(msg) > len(ref_msg), (flavor, errors)
        elif match.startswith("prefix:"):
            prefix = match.removeprefix("prefix:")
            assert msg.startswith(prefix) and ref_msg.startswith(prefix), (flavor, errors)
        elif match.startswith("ours:"):
            assert msg == match.removeprefix("ours:") != ref_msg, (flavor, errors)
        else:
            text = match.removeprefix("substring:")
            assert match.startswith("substring:") and text in msg and text in ref_msg, errors


HL = {
    "type": "host-local",
    "ranges": [[{"subnet": "10.70.0.0/24", "gateway": "10.70.0.1"}]],
    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "172.16.0.0/12", "gw": "10.70.0.254"}],
}
DUAL = {
    "type": "host-local",
    "ranges": [
        [{"subnet": "10.71.0.0/24", "gateway": "10.71.0.1"}],
        [{"subnet": "fd00:71::/64", "gateway": "fd00:71::1"}],
    ],
    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
}
CHAINED_PREV = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "master0"}],
    "ips": [{"address": "10.72.0.5/24", "gateway": "10.72.0.1", "interface": 0}],
    "routes": [{"dst": "0.0.0.0/0"}],
    "dns": {"nameservers": ["10.72.0.53"]},
}


def conf_for(world: World, **fields: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"cniVersion": "1.0.0", "name": "ipnet", "type": "ipvlan"}
    conf["master"] = "master0"
    conf.update(copy.deepcopy(fields))
    if conf.get("ipam", {}).get("type") == "host-local":
        conf["ipam"]["dataDir"] = world.ipam_dir
    return {k: v for k, v in conf.items() if v is not None}


# 1.1.1's CHECK never resolves an omitted master (chained or default route): it looks up "".
REF_CHECK_NO_MASTER = ("error", (999, 'failed to lookup master "": Link not found'))


@dataclass(frozen=True)
class Case:
    id: str
    fields: dict[str, Any]
    vlan: bool = False  # the host has master0.100
    default_route: bool = False  # master0 carries the host's default route
    pod_master: bool = False  # the master is POD_MASTER, in the pod (linkInContainer)
    ref_checks: bool = True  # False: 1.1.1's CHECK fails (REF_CHECK_NO_MASTER), ours passes


CASES = [
    Case("l2", {"mode": "l2", "ipam": HL}),
    Case("l3", {"mode": "l3", "ipam": HL}),
    Case("l3s", {"mode": "l3s", "ipam": HL}),
    Case("default-mode", {"ipam": HL}),
    Case("mtu-1400", {"mtu": 1400, "ipam": HL}),
    Case("mtu-above-master-accepted", {"mtu": 9000, "ipam": HL}),  # 1.1.1 does not check
    Case("dual-stack-l2", {"mode": "l2", "ipam": DUAL}),
    Case(
        "chained-prev-result-master",
        {"master": None, "prevResult": CHAINED_PREV},
        ref_checks=False,
    ),
    Case(
        "default-route-master",
        {"master": None, "mode": "l3", "ipam": HL},
        default_route=True,
        ref_checks=False,
    ),
    Case(
        "link-in-container",
        {"master": POD_MASTER, "linkInContainer": True, "mode": "l2", "ipam": HL},
        pod_master=True,
    ),
    Case("ipvlan-on-vlan", {"master": "master0.100", "mode": "l2", "ipam": HL}, vlan=True),
    Case("macvlan-on-vlan", {"type": "macvlan", "master": "master0.100", "ipam": HL}, vlan=True),
    Case(
        "macvlan-l2-on-vlan",
        {"type": "macvlan", "master": "master0.100", "mode": "vepa"},
        vlan=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_add_check_del_match_the_reference(
    case: Case, worlds: Callable[..., dict[str, World]], bin_dir: Path
) -> None:
    ws = worlds(vlan=case.vlan, default_route=case.default_route, pod_master=case.pod_master)
    raw, results, states = {}, {}, {}
    for flavor, world in ws.items():
        conf = conf_for(world, **case.fields)
        prev = conf.pop("prevResult", None)
        kind, value = outcome(call, flavor, bin_dir, world, "ADD", conf, prev)
        assert kind == "ok", f"{flavor} ADD failed: {value}"
        raw[flavor] = value
        results[flavor] = normalize(value, world)
        states[flavor] = pod_state(world)
    ndisc = "ipv6/conf/eth0/ndisc_notify"
    if case.fields.get("ipam") is DUAL:  # deliberate: 1.1.1 does not set ndisc_notify
        assert states["ref"][ndisc] == "0"
        for flavor in ("exec", "inproc"):
            assert states[flavor][ndisc] == "1"
            states[flavor][ndisc] = "0"
    for flavor in ("exec", "inproc"):
        assert results[flavor] == results["ref"], flavor
        assert states[flavor] == states["ref"], flavor
    kind = case.fields.get("type", "ipvlan")
    assert states["ref"]["kind"] == kind
    assert "UP" in states["ref"]["flags"]
    if kind == "ipvlan":  # an ipvlan link has its master's MAC
        assert {r["interfaces"][0]["mac"] for r in raw.values()} == {MASTER_MAC}
    for flavor, world in ws.items():
        conf = conf_for(world, **case.fields)
        conf.pop("prevResult", None)
        checked = outcome(call, flavor, bin_dir, world, "CHECK", conf, raw[flavor])
        if flavor == "ref" and not case.ref_checks:
            assert checked == REF_CHECK_NO_MASTER
        else:
            assert checked == ("ok", None), (flavor, checked)
        for _ in range(2):
            call(flavor, bin_dir, world, "DEL", conf, raw[flavor])
            world.assert_clean()


@dataclass(frozen=True)
class Bad:
    id: str
    fields: dict[str, Any]
    match: str = "equal"  # how our message relates to the reference's: see assert_errors_match
    ref_leaks_link: bool = False  # 1.1.1 creates the link before IPAM and leaves it there


BAD = [
    Bad("unknown-mode", {"mode": "l4", "ipam": HL}),
    Bad("mtu-not-an-int", {"mtu": "1400", "ipam": HL}),
    Bad("missing-master", {"master": "nope0", "ipam": HL}),
    Bad("no-default-route", {"master": None, "ipam": HL}),
    Bad("chained-without-single-interface", {"master": None, "prevResult": {"ips": []}}),
    Bad(  # 1.1.1 execs IPAM type "" and fails with "no plugin name provided"
        "no-ipam-no-prev-result",
        {},
        match="ours:ipvlan needs IP addresses: set an IPAM plugin in 'ipam.type'",
        ref_leaks_link=True,
    ),
]


@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_bad_config_fails_like_the_reference_and_leaves_nothing(
    bad: Bad, worlds: Callable[..., dict[str, World]], bin_dir: Path
) -> None:
    before = root_links()
    ws = worlds()
    errors = {}
    for flavor, world in ws.items():
        conf = conf_for(world, **bad.fields)
        prev = conf.pop("prevResult", None)
        kind, value = outcome(call, flavor, bin_dir, world, "ADD", conf, prev)
        assert kind == "error", f"{flavor} accepted a bad config: {value}"
        errors[flavor] = value
        if flavor == "ref" and bad.ref_leaks_link:
            assert world.links(world.pod) == ["eth0", "lo"]
            ip("link", "del", "eth0", ns=world.pod)
        world.assert_clean()
        assert root_links() == before
    assert_errors_match(errors, bad.match)


# -- CHECK -----------------------------------------------------------------------------------

CHECK_FIELDS: dict[str, Any] = {"mode": "l2", "ipam": HL}
Breaker = Callable[[World, dict[str, Any], dict[str, Any]], None]


def _break_nothing(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    pass


def _drop_prev(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    prev.clear()


def _other_mode(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    conf["mode"] = "l3"


def _other_mac(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    prev["interfaces"][0]["mac"] = "02:00:00:00:00:99"


def _other_sandbox(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    prev["interfaces"][0]["sandbox"] = "/run/netns/elsewhere"


def _drop_address(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    ip("addr", "del", prev["ips"][0]["address"], "dev", "eth0", ns=world.pod)


def _drop_default_route(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    ip("route", "del", "default", ns=world.pod)


def _drop_link(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    ip("link", "del", "eth0", ns=world.pod)


def _other_kind(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    _drop_link(world, conf, prev)
    ip("link", "add", "eth0", "type", "dummy", ns=world.pod)


def _drop_master(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    conf["master"] = "gone0"


CHECKS: list[tuple[str, Breaker, str]] = [
    ("passes", _break_nothing, ""),
    ("no-prev-result", _drop_prev, "equal"),
    ("mode-changed", _other_mode, "equal"),
    ("mac-mismatch", _other_mac, "equal"),
    ("sandbox-mismatch", _other_sandbox, "equal"),
    ("address-gone", _drop_address, "equal"),
    ("default-route-gone", _drop_default_route, "substring:not found in routing table"),
    ("link-gone", _drop_link, "equal"),
    ("link-not-ipvlan", _other_kind, "equal"),
    ("master-gone", _drop_master, "equal"),
]


@pytest.mark.parametrize(("breaker", "match"), [c[1:] for c in CHECKS], ids=[c[0] for c in CHECKS])
def test_check_fails_like_the_reference(
    breaker: Breaker, match: str, worlds: Callable[..., dict[str, World]], bin_dir: Path
) -> None:
    ws = worlds()
    outcomes = {}
    for flavor, world in ws.items():
        prev = call(flavor, bin_dir, world, "ADD", conf_for(world, **CHECK_FIELDS))
        assert prev is not None
        conf = conf_for(world, **CHECK_FIELDS)
        breaker(world, conf, prev)
        kind, value = outcome(call, flavor, bin_dir, world, "CHECK", conf, prev or None)
        outcomes[flavor] = (kind, normalize(value, world))
    if not match:
        assert all(o == ("ok", None) for o in outcomes.values()), outcomes
        return
    assert all(kind == "error" for kind, _ in outcomes.values()), outcomes
    assert_errors_match({f: tuple(value) for f, (_, value) in outcomes.items()}, match)


# -- DEL -------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["netns-gone", "no-netns", "link-gone"])
def test_del_tolerates_what_the_reference_tolerates(
    how: str, worlds: Callable[..., dict[str, World]], bin_dir: Path
) -> None:
    ws = worlds()
    outcomes, states = {}, {}
    for flavor, world in ws.items():
        conf = conf_for(world, **CHECK_FIELDS)
        prev = call(flavor, bin_dir, world, "ADD", conf)
        netns = None
        if how == "netns-gone":
            ip("netns", "del", world.pod)
        elif how == "no-netns":
            netns = ""
        else:
            ip("link", "del", "eth0", ns=world.pod)
        outcomes[flavor] = [
            outcome(call, flavor, bin_dir, world, "DEL", conf, prev, netns) for _ in range(2)
        ]
        assert world.reserved_ips() == [] and world.links(world.host) == world.host_links
        states[flavor] = pod_state(world) if how != "netns-gone" else {}
    assert outcomes["exec"] == outcomes["inproc"] == [("ok", None)] * 2, outcomes
    assert outcomes["ref"] == outcomes["exec"], outcomes
    # Without CNI_NETNS only IPAM is released: the link stays until the netns goes.
    assert states["exec"] == states["ref"] and states["inproc"] == states["ref"]
