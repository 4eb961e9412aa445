"""ipvlan against the reference plugin (/usr/lib/cni, 1.1.1), and macvlan/ipvlan on a VLAN.

These need ipvlan, 802.1q and dummy, which the host kernel lacks: they run in the VM
tier (tests/vm/test_guest_suite.py) and skip wherever `ip link add ... type ipvlan`
is not supported. As in tests/netns/test_macvlan_differential.py each case runs in
three fresh worlds: the reference binary, our binary (exec'd) and our in-process plugin
(BuiltinExecutor); a world is a host namespace holding the master (a dummy, or a VLAN
on it) plus a pod namespace. Results must match modulo namespace paths, and so must the
pod's kernel state. Deliberate difference: ndisc_notify is 1 with IPv6 on our side.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
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


class World:
    """Host namespace with `master0` (a dummy, up) and maybe `master0.100`; a pod namespace."""

    def __init__(self, tag: str, root: Path, vlan: bool) -> None:
        self.host, self.pod = f"{PREFIX}-{tag}-h", f"{PREFIX}-{tag}-p"
        self.cid = f"{PREFIX}-{tag}"
        self.ipam_dir = str(root / "ipam")
        for ns in (self.host, self.pod):
            ip("netns", "add", ns)
            ip("link", "set", "lo", "up", ns=ns)
        ip("link", "add", "master0", "type", "dummy", ns=self.host)
        ip("link", "set", "master0", "up", ns=self.host)
        if vlan:
            vlan_args = ("link", "master0", "name", "master0.100", "type", "vlan", "id", "100")
            ip("link", "add", *vlan_args, ns=self.host)
            ip("link", "set", "master0.100", "up", ns=self.host)

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


@pytest.fixture
def worlds(tmp_path: Path) -> Iterator[Callable[[bool], dict[str, World]]]:
    made: list[World] = []

    def make(vlan: bool = False) -> dict[str, World]:
        out = {}
        for flavor in FLAVORS:
            made.append(World(f"{len(made)}", tmp_path / f"w{len(made)}", vlan))
            out[flavor] = made[-1]
        return out

    yield make
    for world in made:
        world.destroy()


def call(
    flavor: str,
    bin_dir: Path,
    world: World,
    verb: str,
    conf: dict[str, Any],
    prev: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """One plugin call on a thread inside the world's host namespace."""
    executor: Executor = BuiltinExecutor() if flavor == "inproc" else ExecExecutor(timeout=120)
    path = [str(bin_dir if flavor == "exec" else REFERENCE)]
    net = load_network_config(json.dumps(conf).encode())
    stdin = plugin_stdin(net, net.plugins[0], {}, prev)
    env = cni_env(verb, world.cid, world.pod_path, "eth0", (), path)
    out = run_in_netns(f"/run/netns/{world.host}", lambda: executor.run(conf["type"], stdin, env))
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
    """A result with the world's pod path and MACs (the dummy master's are random) masked."""
    out = json.loads(json.dumps(value).replace(world.pod_path, "<pod>"))
    for iface in out.get("interfaces", []):
        iface["mac"] = "<mac>"
    return out


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


CASES: list[tuple[str, dict[str, Any], bool]] = [
    # (id, config fields, the master is the VLAN sub-interface)
    ("l2", {"mode": "l2", "ipam": HL}, False),
    ("l3", {"mode": "l3", "ipam": HL}, False),
    ("l3s", {"mode": "l3s", "ipam": HL}, False),
    ("default-mode", {"ipam": HL}, False),
    ("mtu-1400", {"mtu": 1400, "ipam": HL}, False),
    ("mtu-above-master-accepted", {"mtu": 9000, "ipam": HL}, False),  # 1.1.1 does not check
    ("dual-stack-l2", {"mode": "l2", "ipam": DUAL}, False),
    ("chained-prev-result-master", {"master": None, "prevResult": CHAINED_PREV}, False),
    ("ipvlan-on-vlan", {"master": "master0.100", "mode": "l2", "ipam": HL}, True),
    ("macvlan-on-vlan", {"type": "macvlan", "master": "master0.100", "ipam": HL}, True),
    ("macvlan-l2-on-vlan", {"type": "macvlan", "master": "master0.100", "mode": "vepa"}, True),
]


@pytest.mark.parametrize(("fields", "vlan"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_add_check_del_match_the_reference(
    fields: dict[str, Any], vlan: bool, worlds: Callable[[bool], dict[str, World]], bin_dir: Path
) -> None:
    ws = worlds(vlan)
    raw, results, states = {}, {}, {}
    for flavor, world in ws.items():
        conf = conf_for(world, **fields)
        prev = conf.pop("prevResult", None)
        kind, value = outcome(call, flavor, bin_dir, world, "ADD", conf, prev)
        assert kind == "ok", f"{flavor} ADD failed: {value}"
        raw[flavor] = value
        results[flavor] = normalize(value, world)
        states[flavor] = pod_state(world)
    ndisc = "ipv6/conf/eth0/ndisc_notify"
    if fields.get("ipam") is DUAL:  # deliberate: 1.1.1 does not set ndisc_notify
        assert states["ref"][ndisc] == "0"
        for flavor in ("exec", "inproc"):
            assert states[flavor][ndisc] == "1"
            states[flavor][ndisc] = "0"
    for flavor in ("exec", "inproc"):
        assert results[flavor] == results["ref"], flavor
        assert states[flavor] == states["ref"], flavor
    assert states["ref"]["kind"] == fields.get("type", "ipvlan")
    assert "UP" in states["ref"]["flags"]
    if fields.get("type", "ipvlan") == "ipvlan":  # an ipvlan link has its master's MAC
        for flavor, world in ws.items():
            master = fields.get("master") or "master0"
            (info,) = json.loads(ip("-j", "link", "show", "dev", master, ns=world.host).stdout)
            assert raw[flavor]["interfaces"][0]["mac"] == info["address"], flavor
    for flavor, world in ws.items():
        conf = conf_for(world, **fields)
        conf.pop("prevResult", None)
        if conf.get("master"):  # 1.1.1's ipvlan CHECK cannot look up a chained master
            call(flavor, bin_dir, world, "CHECK", conf, raw[flavor])
        for _ in range(2):
            call(flavor, bin_dir, world, "DEL", conf, raw[flavor])
            assert world.links(world.pod) == ["lo"]
            assert world.reserved_ips() == []


BAD: list[tuple[str, dict[str, Any], str]] = [
    # (id, config fields, how our message relates to the reference's)
    ("unknown-mode", {"mode": "l4", "ipam": HL}, "equal"),
    ("missing-master", {"master": "nope0", "ipam": HL}, "code"),
    ("chained-without-single-interface", {"master": None, "prevResult": {"ips": []}}, "equal"),
    ("no-ipam-no-prev-result", {}, "code"),
]


@pytest.mark.parametrize(("fields", "match"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config_fails_like_the_reference(
    fields: dict[str, Any], match: str, worlds: Callable[[bool], dict[str, World]], bin_dir: Path
) -> None:
    ws = worlds(False)
    errors = {}
    for flavor, world in ws.items():
        conf = conf_for(world, **fields)
        prev = conf.pop("prevResult", None)
        kind, value = outcome(call, flavor, bin_dir, world, "ADD", conf, prev)
        assert kind == "error", f"{flavor} accepted a bad config: {value}"
        errors[flavor] = value
        assert world.reserved_ips() == []
        if flavor != "ref":  # 1.1.1 leaves its link behind when IPAM cannot run
            assert world.links(world.pod) == ["lo"]
    for flavor in ("exec", "inproc"):
        assert errors[flavor][0] == errors["ref"][0], errors
        if match == "equal":
            assert errors[flavor][1] == errors["ref"][1], errors


def test_check_fails_like_the_reference_on_a_mode_change(
    worlds: Callable[[bool], dict[str, World]], bin_dir: Path
) -> None:
    ws = worlds(False)
    messages = {}
    for flavor, world in ws.items():
        prev = call(flavor, bin_dir, world, "ADD", conf_for(world, mode="l2", ipam=HL))
        conf = conf_for(world, mode="l3", ipam=HL)
        messages[flavor] = outcome(call, flavor, bin_dir, world, "CHECK", conf, prev)
    assert messages["ref"] == (
        "error",
        (999, "Container IPVlan mode l2 does not match expected value: l3"),
    )
    assert messages["exec"] == messages["ref"] and messages["inproc"] == messages["ref"]
