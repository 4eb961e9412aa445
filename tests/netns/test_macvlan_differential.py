"""Differential tests: Plexus's macvlan against the reference plugin (/usr/lib/cni, 1.1.1).

Every case runs in three fresh worlds, one per flavor: the reference binary, our
standalone binary (`plexus-macvlan`, exec'd) and our in-process plugin (BuiltinExecutor).
A world is a "host" namespace holding the master (the veth end `up0`, its peer up, so the
macvlan has a carrier) and a separate pod namespace. Plugins run on a thread that has
entered the host namespace (exec'd binaries inherit it). The results must match modulo
random MACs and namespace paths, and so must the kernel state in the pod: link kind,
macvlan mode, broadcast queue length, MTU, flags, addresses, routes and the
arp_notify/arp_filter/ndisc_notify sysctls, and disable_ipv6 of every pod interface.

Known, deliberate differences from 1.1.1 (asserted as such below; docs/migrating-from-multus.md
lists them):
- ndisc_notify: we set it to 1 when an IPv6 address goes on (as later reference versions
  do); 1.1.1 leaves it 0.
- a route without `gw` in the result: CHECK accepts the route ADD installed through the
  default gateway; 1.1.1 fails it ("Expected Route ... not found").
- a failure once the link exists (IPAM, or a route that cannot be added): we delete the
  link, 1.1.1 leaves it in the pod.
- IPAM failures: our in-process IPAMs report spec codes, 1.1.1 999 (same messages).
- DEL with the master gone or its MTU now below the config's: ours succeeds, 1.1.1 fails.
- ADD into a missing netns: ours code 3 naming the path, 1.1.1 999 "failed to open netns".
- an interface name already taken in the pod: ours fail creating the link (we create it
  under its final name), 1.1.1 renaming it (it creates a temporary name first).
- mode `source`, `bcqueuelen` and cniVersion 1.1.0 are ours only.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from cni.config import load_network_config, plugin_stdin
from cni.env import cni_env
from cni.errors import CNIError, ErrorCode
from cni.invoke import ExecExecutor, Executor
from delegates.builtin import BuiltinExecutor
from delegates.link import PLUGIN_ERROR
from delegates.netns import run_in_netns
from meta.install import install_binaries

REFERENCE = Path("/usr/lib/cni")
KERNEL_BCQUEUELEN = 1000  # the macvlan broadcast queue length the kernel defaults to
PREFIX = f"pxmd{os.getpid() % 100000}{uuid.uuid4().hex[:4]}"
FLAVORS = ("ref", "exec", "inproc")
FIXED_MAC = "02:12:34:56:78:9a"

if os.geteuid() != 0 or not (REFERENCE / "macvlan").exists():
    pytest.skip("needs root and the reference plugins in /usr/lib/cni", allow_module_level=True)


def sh(*cmd: str, ns: str = "", check: bool = True) -> str:
    full = ["ip", "-n", ns, *cmd[1:]] if ns and cmd[0] == "ip" else list(cmd)
    if ns and cmd[0] != "ip":
        full = ["ip", "netns", "exec", ns, *cmd]
    proc = subprocess.run(full, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(full)}: {proc.stderr.strip()}")
    return proc.stdout


# -- worlds --------------------------------------------------------------------------------


@dataclass
class World:
    """A host namespace with the master, a pod namespace and a state dir."""

    tag: str
    root: Path
    namespaces: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        return f"{PREFIX}-{self.tag}-h"

    @property
    def pod(self) -> str:
        return f"{PREFIX}-{self.tag}-p"

    @property
    def pod_path(self) -> str:
        return f"/run/netns/{self.pod}"

    @property
    def ipam_dir(self) -> str:
        return str(self.root / "ipam")

    def create(self, default_route: bool, pod_master: bool, ipv6_off: bool = False) -> None:
        for ns in (self.host, self.pod):
            sh("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
        if ipv6_off:  # as runtimes that disable IPv6 leave a pod: ADD must turn it back on
            for key in ("default", "lo"):
                sh("sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1", ns=self.pod)
        self._veth(self.host, "up0", "up1")
        if default_route:
            sh("ip", "addr", "add", "192.0.2.2/24", "dev", "up0", ns=self.host)
            sh("ip", "route", "add", "default", "via", "192.0.2.1", ns=self.host)
        if pod_master:
            self._veth(self.pod, "cup0", "cup1")

    @staticmethod
    def _veth(ns: str, a: str, b: str) -> None:
        sh("ip", "link", "add", a, "type", "veth", "peer", "name", b, ns=ns)
        for name in (a, b):
            sh("ip", "link", "set", name, "up", ns=ns)

    def destroy(self) -> None:
        for ns in reversed(self.namespaces):
            sh("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()

    def links(self, ns: str) -> list[str]:
        return sorted(link["ifname"] for link in json.loads(sh("ip", "-j", "link", "show", ns=ns)))

    def reserved_ips(self) -> list[str]:
        base = Path(self.ipam_dir)
        skip = {"lock"}
        return sorted(
            p.name
            for p in base.rglob("*")
            if p.is_file() and p.name not in skip and not p.name.startswith("last_reserved_ip")
        )


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our binaries, with `macvlan` being ours and every other type the reference's."""
    path = tmp_path_factory.mktemp("bin")
    install_binaries(path)
    for plugin in REFERENCE.iterdir():
        if plugin.name != "macvlan":
            (path / plugin.name).symlink_to(plugin)
    (path / "macvlan").symlink_to(path / "plexus-macvlan")
    return path


@pytest.fixture(scope="module", autouse=True)
def sweep() -> Iterator[None]:
    """Delete any namespace of this session left behind, even after a crash."""
    yield
    for ns in sh("ip", "netns", "list").split():
        if ns.startswith(PREFIX):
            sh("ip", "netns", "del", ns, check=False)


@pytest.fixture
def worlds(tmp_path: Path) -> Iterator[Callable[..., dict[str, World]]]:
    made: list[World] = []

    def make(
        default_route: bool = False, pod_master: bool = False, ipv6_off: bool = False
    ) -> dict[str, World]:
        out = {}
        for flavor in FLAVORS:
            world = World(f"{len(made)}{flavor[0]}", tmp_path / f"{flavor}{len(made)}")
            made.append(world)
            world.create(default_route, pod_master, ipv6_off)
            out[flavor] = world
        return out

    yield make
    for world in made:
        world.destroy()


# -- calling the plugins ---------------------------------------------------------------------


@dataclass
class Caller:
    """One flavor: an executor and its CNI_PATH; calls run inside the world's host netns."""

    flavor: str
    bin_dir: Path

    def executor(self) -> tuple[Executor, list[str]]:
        if self.flavor == "ref":
            return ExecExecutor(timeout=60), [str(REFERENCE)]
        if self.flavor == "exec":
            return ExecExecutor(timeout=60), [str(self.bin_dir)]
        return BuiltinExecutor(), [str(REFERENCE)]

    def run(
        self,
        world: World,
        verb: str,
        net: dict[str, Any],
        prev: dict[str, Any] | None = None,
        cni_args: tuple[tuple[str, str], ...] = (),
        runtime_config: dict[str, Any] | None = None,
        netns: str | None = None,
        in_pod: bool = False,
    ) -> dict[str, Any] | None:
        """Run `verb` over the plugins of `net` (a conf or conflist) like libcni does."""
        executor, path = self.executor()
        netlist = load_network_config(json.dumps(net).encode())
        plugins = list(reversed(netlist.plugins)) if verb == "DEL" else netlist.plugins
        cid = f"{PREFIX}-{world.tag}"
        env = cni_env(verb, cid, world.pod_path if netns is None else netns, "eth0", cni_args, path)
        where = f"/run/netns/{world.pod if in_pod else world.host}"
        out: dict[str, Any] | None = prev
        for plugin in plugins:
            stdin = plugin_stdin(netlist, plugin, runtime_config or {}, out)
            raw = run_in_netns(where, partial(executor.run, plugin["type"], stdin, env))
            if verb == "ADD":
                out = json.loads(raw)
            else:
                assert raw == b"", raw
        return out if verb == "ADD" else None


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """("ok", fn(...)) or ("error", (code, msg))."""
    try:
        return "ok", fn(*args, **kwargs)
    except CNIError as err:
        return "error", (err.code, err.msg)


def normalize(value: Any, world: World, fixed_mac: bool) -> Any:
    """A result or error with world-specific paths and (unless fixed) MACs masked."""
    text = json.dumps(value).replace(world.pod_path, "<pod>").replace(world.host, "<host>")
    out = json.loads(text)
    if isinstance(out, dict) and not fixed_mac:
        for iface in out.get("interfaces", []):
            iface["mac"] = "<mac>"
    return out


def pod_state(world: World) -> dict[str, Any]:
    """The kernel state the plugin is responsible for, in the world's pod namespace."""
    ns = world.pod
    links = world.links(ns)
    if "eth0" not in links:
        return {"links": links}
    (link,) = json.loads(sh("ip", "-d", "-j", "addr", "show", "dev", "eth0", ns=ns))
    info = link.get("linkinfo", {})
    addrs = [
        (a["family"], a["local"], a["prefixlen"], a.get("broadcast"), a.get("scope"))
        for a in link["addr_info"]
        if not a["local"].startswith("fe80")
    ]
    state: dict[str, Any] = {
        "links": links,
        "kind": info.get("info_kind"),
        "mode": info.get("info_data", {}).get("mode"),
        "bcqueuelen": info.get("info_data", {}).get("bcqueuelen"),
        "mtu": link["mtu"],
        "flags": sorted(link["flags"]),
        "promiscuity": link.get("promiscuity"),
        "addrs": sorted(addrs),
        "routes": routes(ns),
    }
    keys = ["ipv4/conf/eth0/arp_notify", "ipv4/conf/eth0/arp_filter", NDISC]
    keys += [f"ipv6/conf/{name}/disable_ipv6" for name in links]
    for key in keys:
        state[key] = sh("cat", f"/proc/sys/net/{key}", ns=ns).strip()
    return state


def routes(ns: str) -> list[tuple[Any, ...]]:
    found = []
    for family in ("-4", "-6"):
        for r in json.loads(sh("ip", family, "-d", "-j", "route", "show", "table", "all", ns=ns)):
            if r["dst"].startswith(("fe80", "ff00")) or r.get("dev") == "lo":
                continue
            keys = ("type", "dst", "gateway", "dev", "protocol", "scope", "table", "metric")
            found.append(tuple(str(r.get(k)) for k in keys))
    return sorted(found)


# -- the matrix ------------------------------------------------------------------------------

NDISC = "ipv6/conf/eth0/ndisc_notify"

Conf = Callable[[World], dict[str, Any]]


def macvlan(**extra: Any) -> Conf:
    def build(world: World) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "cniVersion": "1.0.0",
            "name": "mvnet",
            "type": "macvlan",
            "master": "up0",
        }
        conf.update(copy.deepcopy(extra))
        if "ipam" in conf and conf["ipam"].get("type") == "host-local":
            conf["ipam"]["dataDir"] = world.ipam_dir
        return {k: v for k, v in conf.items() if v is not None}

    return build


def host_local(*ranges: list[dict[str, str]], routes: list[dict[str, str]] | None = None) -> Any:
    ipam: dict[str, Any] = {"type": "host-local", "ranges": list(ranges)}
    if routes is not None:
        ipam["routes"] = routes
    return ipam


HL = host_local([{"subnet": "10.10.0.0/24", "gateway": "10.10.0.1"}], routes=[{"dst": "0.0.0.0/0"}])
STATIC = {
    "type": "static",
    "addresses": [
        {"address": "10.40.0.5/24", "gateway": "10.40.0.1"},
        {"address": "10.41.0.5/16"},
    ],
    "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.40.0.254"}],
    "dns": {"nameservers": ["10.40.0.53"], "domain": "ipam.example", "search": ["a.example"]},
}


@dataclass
class Case:
    id: str
    net: Conf
    cni_args: tuple[tuple[str, str], ...] = ()
    runtime_config: dict[str, Any] | None = None
    fixed_mac: bool = False
    v6: bool = False
    default_route: bool = False
    pod_master: bool = False  # the master lives in the pod (linkInContainer)
    check: bool = True
    check_error: int = 0  # the code CHECK must fail with (all flavors), 0 = must pass
    expect: dict[str, Any] = field(default_factory=dict)  # pod_state entries ADD must give


def chained_tuning(world: World) -> dict[str, Any]:
    first = macvlan(mode="bridge", ipam=HL)(world)
    # tuning 1.1.1 expands an IFNAME placeholder in sysctl keys on ADD but not on CHECK,
    # so the key names the interface.
    sysctl = {"net.ipv4.conf.eth0.arp_filter": "1"}
    tuning = {"type": "tuning", "promisc": True, "mtu": 1300, "sysctl": sysctl}
    return {"cniVersion": "1.0.0", "name": "mvnet", "plugins": [first, tuning]}


def link_in_container(world: World) -> dict[str, Any]:
    return macvlan(master="cup0", linkInContainer=True, ipam=HL)(world)


CASES = [
    Case("bridge-l2-only", macvlan(mode="bridge")),
    Case("default-mode-l2-only", macvlan()),
    Case("private-host-local", macvlan(mode="private", ipam=HL)),
    Case("vepa-host-local", macvlan(mode="vepa", ipam=HL)),
    Case("passthru-l2-only", macvlan(mode="passthru")),
    Case("passthru-host-local", macvlan(mode="passthru", ipam=HL)),
    Case("mtu-1400", macvlan(mtu=1400, ipam=HL)),
    Case("mtu-equal-master", macvlan(mtu=1500)),
    Case("mac-config", macvlan(mac=FIXED_MAC, ipam=HL), fixed_mac=True),
    Case(
        "mac-runtime-config",
        macvlan(ipam=HL, capabilities={"mac": True}),
        runtime_config={"mac": FIXED_MAC},
        fixed_mac=True,
    ),
    Case(
        "mac-cni-args",
        macvlan(ipam=HL),
        cni_args=(("IgnoreUnknown", "1"), ("K8S_POD_NAME", "p"), ("MAC", FIXED_MAC)),
        fixed_mac=True,
    ),
    Case(
        "mac-precedence",
        macvlan(mac="02:00:00:00:00:01", capabilities={"mac": True}),
        cni_args=(("MAC", "02:00:00:00:00:02"),),
        runtime_config={"mac": FIXED_MAC},
        fixed_mac=True,
    ),
    Case(
        "host-local-several-ranges-dual-stack",
        macvlan(
            ipam=host_local(
                [
                    {"subnet": "10.20.0.0/24", "gateway": "10.20.0.1"},
                    {"subnet": "10.21.0.0/24"},
                ],
                [{"subnet": "fd00:20::/64", "gateway": "fd00:20::1"}],
                routes=[{"dst": "0.0.0.0/0"}, {"dst": "::/0"}, {"dst": "172.16.0.0/12"}],
            )
        ),
        v6=True,
        check=False,  # a gateway-less non-default route: see test_check_route_without_gw
    ),
    Case(
        "host-local-two-v4-ranges",
        macvlan(
            ipam=host_local(
                [{"subnet": "10.30.0.0/24", "gateway": "10.30.0.1"}],
                [{"subnet": "10.31.0.0/24", "gateway": "10.31.0.1"}],
                routes=[{"dst": "0.0.0.0/0"}, {"dst": "172.16.0.0/12", "gw": "10.31.0.254"}],
            )
        ),
    ),
    Case("static-routes-dns", macvlan(ipam=STATIC, dns={"nameservers": ["10.0.0.53"]})),
    Case(
        "static-v6",
        macvlan(
            ipam={
                "type": "static",
                "addresses": [{"address": "fd00:40::5/64", "gateway": "fd00:40::1"}],
                "routes": [{"dst": "::/0"}],
            }
        ),
        v6=True,
    ),
    Case(
        "chained-tuning",
        chained_tuning,
        expect={"ipv4/conf/eth0/arp_filter": "1", "promiscuity": 1, "mtu": 1300},
    ),
    Case("link-in-container", link_in_container, pod_master=True),
    Case("default-route-master", macvlan(master=None, ipam=HL), default_route=True),
    Case("cni-0.3.1", macvlan(cniVersion="0.3.1", ipam=HL), check_error=1),
    Case("cni-0.4.0-l2", macvlan(cniVersion="0.4.0")),
    Case("cni-0.2.0", macvlan(cniVersion="0.2.0", ipam=HL), check_error=1),
]


def add_all(
    case: Case, ws: dict[str, World], bin_dir: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """ADD in every world; the raw results and the pod states."""
    raw, states = {}, {}
    for flavor, world in ws.items():
        caller = Caller(flavor, bin_dir)
        kind, value = outcome(
            caller.run,
            world,
            "ADD",
            case.net(world),
            cni_args=case.cni_args,
            runtime_config=case.runtime_config,
            in_pod=case.pod_master and flavor == "ref",
        )
        assert kind == "ok", f"{flavor} ADD failed: {value}"
        raw[flavor] = value
        states[flavor] = pod_state(world)
    return raw, states


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_add_check_del_match_the_reference(
    case: Case, worlds: Callable[..., dict[str, World]], bin_dir: Path
) -> None:
    ws = worlds(default_route=case.default_route, pod_master=case.pod_master, ipv6_off=case.v6)
    raw, states = add_all(case, ws, bin_dir)
    results = {f: normalize(raw[f], ws[f], case.fixed_mac) for f in ws}
    if case.v6:  # the pod started with IPv6 off; ADD turns it on for lo and the interface
        assert states["ref"]["ipv6/conf/lo/disable_ipv6"] == "0"
        assert states["ref"]["ipv6/conf/eth0/disable_ipv6"] == "0"
    if case.v6:  # deliberate: we set ndisc_notify for IPv6, 1.1.1 does not
        assert states["ref"][NDISC] == "0"
        for flavor in ("exec", "inproc"):
            assert states[flavor][NDISC] == "1"
            states[flavor][NDISC] = "0"
    for flavor in ("exec", "inproc"):
        assert results[flavor] == results["ref"], flavor
        assert states[flavor] == states["ref"], flavor
    assert states["ref"]["kind"] == "macvlan" and "UP" in states["ref"]["flags"]
    assert states["ref"]["bcqueuelen"] == KERNEL_BCQUEUELEN
    for key, value in case.expect.items():
        assert states["ref"][key] == value, key
    if case.fixed_mac:
        assert raw["ref"]["interfaces"][0]["mac"] == FIXED_MAC
    for flavor, world in ws.items():
        caller = Caller(flavor, bin_dir)
        net = case.net(world)
        ref_in_pod = case.pod_master and flavor == "ref"
        if case.check:
            checked = outcome(caller.run, world, "CHECK", net, prev=raw[flavor], in_pod=ref_in_pod)
            if case.check_error:  # CHECK is refused below cniVersion 0.4.0
                assert checked[0] == "error" and checked[1][0] == case.check_error, checked
            else:
                assert checked == ("ok", None), (flavor, checked)
        for _ in range(2):  # DEL is idempotent
            caller.run(world, "DEL", net, prev=raw[flavor], in_pod=ref_in_pod)
            assert world.links(world.pod) == (["cup0", "cup1", "lo"] if case.pod_master else ["lo"])
            assert world.reserved_ips() == []


def test_cni_1_1_0_is_ours_only(worlds: Callable[..., dict[str, World]], bin_dir: Path) -> None:
    """1.1.1 rejects cniVersion 1.1.0; we accept it and report the interface MTU."""
    ws = worlds()
    net = macvlan(cniVersion="1.1.0", mtu=1400, ipam=HL)
    kind, err = outcome(lambda: Caller("ref", bin_dir).run(ws["ref"], "ADD", net(ws["ref"])))
    assert (kind, err[0]) == ("error", 1)
    for flavor in ("exec", "inproc"):
        world = ws[flavor]
        result = Caller(flavor, bin_dir).run(world, "ADD", net(world))
        assert result is not None and result["cniVersion"] == "1.1.0"
        assert result["interfaces"][0]["mtu"] == 1400
        Caller(flavor, bin_dir).run(world, "CHECK", net(world), prev=result)
        Caller(flavor, bin_dir).run(world, "STATUS", net(world))
        Caller(flavor, bin_dir).run(world, "DEL", net(world), prev=result)
        assert world.links(world.pod) == ["lo"] and world.reserved_ips() == []


# -- bad configs -----------------------------------------------------------------------------


@dataclass
class Bad:
    id: str
    net: Conf
    match: str = "equal"  # how our message relates to the reference's: equal/contains/prefix
    cni_args: tuple[tuple[str, str], ...] = ()
    ref_leaks_link: bool = False  # a 1.1.1 bug: the link stays when IPAM or ConfigureIface fails
    ours_code: int = 0  # deliberate: our spec code where the reference reports 999 (0 = same)


BAD = [
    Bad("unknown-mode", macvlan(mode="foo", ipam=HL)),
    Bad("misspelt-mode", macvlan(mode="Bridge", ipam=HL)),
    Bad("mtu-above-master", macvlan(mtu=9000, ipam=HL)),
    Bad("mtu-negative", macvlan(mtu=-1, ipam=HL)),
    Bad("mtu-not-an-int", macvlan(mtu="1400", ipam=HL)),
    Bad("missing-master", macvlan(master="nope0", ipam=HL), match="contains"),
    Bad("no-default-route", macvlan(master=None, ipam=HL)),
    Bad("bad-mac-config", macvlan(mac="02:00:00:00:00:zz", ipam=HL)),
    Bad("bad-mac-cni-args", macvlan(ipam=HL), cni_args=(("MAC", "nope"),)),
    Bad("unknown-cni-args", macvlan(ipam=HL), cni_args=(("K8S_POD_NAME", "p"),)),
    Bad(
        "route-fails-after-ipam",
        macvlan(
            ipam=host_local(
                [{"subnet": "10.50.0.0/24", "gateway": "10.50.0.1"}],
                routes=[{"dst": "10.77.0.0/16", "gw": "10.200.0.1"}],
            )
        ),
        match="prefix:failed to add route '",
        ref_leaks_link=True,
    ),
    # Our in-process IPAMs report spec codes (delegates.ipam.common), the reference 999.
    Bad(
        "ipam-range-exhausted",
        macvlan(
            ipam=host_local(
                [{"subnet": "10.51.0.0/24", "rangeStart": "10.51.0.1", "rangeEnd": "10.51.0.1"}]
            )
        ),
        ref_leaks_link=True,
        ours_code=ErrorCode.TRY_AGAIN_LATER,
    ),
    Bad(
        "ipam-invalid-subnet",
        macvlan(ipam=host_local([{"subnet": "10.52.0.1/24"}])),
        ref_leaks_link=True,
        ours_code=ErrorCode.INVALID_CONFIG,
    ),
    Bad(
        "ipam-range-start-outside-subnet",
        macvlan(ipam=host_local([{"subnet": "10.53.0.0/24", "rangeStart": "10.54.0.5"}])),
        ref_leaks_link=True,
        ours_code=ErrorCode.INVALID_CONFIG,
    ),
    Bad(
        "ipam-static-address-invalid",
        macvlan(ipam={"type": "static", "addresses": [{"address": "10.55.0.5"}]}),
        ref_leaks_link=True,
        ours_code=ErrorCode.INVALID_CONFIG,
    ),
]


@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_bad_config_fails_like_the_reference_and_leaves_nothing(
    bad: Bad, worlds: Callable[..., dict[str, World]], bin_dir: Path
) -> None:
    ws = worlds()
    errors = {}
    for flavor, world in ws.items():
        caller = Caller(flavor, bin_dir)
        kind, value = outcome(caller.run, world, "ADD", bad.net(world), cni_args=bad.cni_args)
        assert kind == "error", f"{flavor} accepted a bad config: {value}"
        errors[flavor] = value
        assert world.links(world.host) == ["lo", "up0", "up1"]
        assert world.reserved_ips() == []
        pod_links = world.links(world.pod)
        if flavor == "ref" and bad.ref_leaks_link:
            assert pod_links == ["eth0", "lo"]
        else:
            assert pod_links == ["lo"], flavor
    ref_code, ref_msg = errors["ref"]
    if bad.ours_code:
        assert ref_code == PLUGIN_ERROR, errors
    for flavor in ("exec", "inproc"):
        code, msg = errors[flavor]
        assert code == (bad.ours_code or ref_code), (flavor, errors)
        if bad.match == "equal":
            assert msg == ref_msg
        elif bad.match == "contains":
            assert ref_msg in msg and len(msg) > len(ref_msg)
        else:
            prefix = bad.match.removeprefix("prefix:")
            assert msg.startswith(prefix) and ref_msg.startswith(prefix)


# -- CHECK -----------------------------------------------------------------------------------

CHECK_NET = macvlan(mac=FIXED_MAC, ipam=HL)


def _break_nothing(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    pass


def _drop_prev(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    prev.clear()


def _other_mode(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    conf["mode"] = "private"


def _other_mac(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    prev["interfaces"][0]["mac"] = "02:00:00:00:00:99"


def _other_sandbox(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    prev["interfaces"][0]["sandbox"] = "/run/netns/elsewhere"


def _drop_address(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    sh("ip", "addr", "del", prev["ips"][0]["address"], "dev", "eth0", ns=world.pod)


def _drop_default_route(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    sh("ip", "route", "del", "default", ns=world.pod)


def _drop_link(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    sh("ip", "link", "del", "eth0", ns=world.pod)


def _drop_master(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    conf["master"] = "gone0"


def _other_kind_in_place(world: World, conf: dict[str, Any], prev: dict[str, Any]) -> None:
    """eth0 becomes a bridge (the test kernel has no dummy) with the same name, MAC,
    addresses and routes."""
    routes = json.loads(sh("ip", "-4", "-j", "route", "show", ns=world.pod))
    sh("ip", "link", "del", "eth0", ns=world.pod)
    sh("ip", "link", "add", "eth0", "address", FIXED_MAC, "type", "bridge", ns=world.pod)
    sh("ip", "link", "set", "eth0", "up", ns=world.pod)
    for ip in prev["ips"]:
        sh("ip", "addr", "add", ip["address"], "dev", "eth0", ns=world.pod)
    for r in routes:
        if "gateway" in r:
            sh("ip", "route", "replace", r["dst"], "via", r["gateway"], "dev", "eth0", ns=world.pod)
    kind = json.loads(sh("ip", "-d", "-j", "link", "show", "eth0", ns=world.pod))[0]
    assert kind["linkinfo"]["info_kind"] == "bridge" and kind["address"] == FIXED_MAC


CHECKS: list[tuple[str, Callable[[World, dict[str, Any], dict[str, Any]], None], str]] = [
    ("passes", _break_nothing, ""),
    ("no-prev-result", _drop_prev, "equal"),
    ("mode-mismatch", _other_mode, "equal"),
    ("mac-mismatch", _other_mac, "equal"),
    ("sandbox-mismatch", _other_sandbox, "equal"),
    ("address-gone", _drop_address, "equal"),
    ("default-route-gone", _drop_default_route, "not found in routing table"),
    ("link-gone", _drop_link, "equal"),
    ("master-gone", _drop_master, "contains"),
    ("kind-not-macvlan", _other_kind_in_place, "equal"),
]


@pytest.mark.parametrize(("breaker", "match"), [c[1:] for c in CHECKS], ids=[c[0] for c in CHECKS])
def test_check_matches_the_reference(
    breaker: Callable[[World, dict[str, Any], dict[str, Any]], None],
    match: str,
    worlds: Callable[..., dict[str, World]],
    bin_dir: Path,
) -> None:
    ws = worlds()
    outcomes = {}
    for flavor, world in ws.items():
        caller = Caller(flavor, bin_dir)
        prev = caller.run(world, "ADD", CHECK_NET(world))
        assert prev is not None
        conf = CHECK_NET(world)
        breaker(world, conf, prev)
        kind, value = outcome(caller.run, world, "CHECK", conf, prev=prev or None)
        outcomes[flavor] = (kind, normalize(value, world, True))
    if not match:
        assert all(o == ("ok", None) for o in outcomes.values()), outcomes
        return
    (ref_kind, (ref_code, ref_msg)) = outcomes["ref"]
    assert ref_kind == "error"
    for flavor in ("exec", "inproc"):
        kind, (code, msg) = outcomes[flavor]
        assert (kind, code) == ("error", ref_code), outcomes
        if match == "equal":
            assert msg == ref_msg
        elif match == "contains":
            assert ref_msg in msg
        else:
            assert match in msg and match in ref_msg


def test_check_route_without_gw(worlds: Callable[..., dict[str, World]], bin_dir: Path) -> None:
    """Deliberate difference: a result route without `gw` went in via the default gateway;
    1.1.1's CHECK looks for a gateway-less route and fails, ours finds the installed one."""
    net = macvlan(
        ipam={
            "type": "static",
            "addresses": [{"address": "10.60.0.5/24", "gateway": "10.60.0.1"}],
            "routes": [{"dst": "192.168.0.0/16"}],
        }
    )
    ws = worlds()
    for flavor, world in ws.items():
        caller = Caller(flavor, bin_dir)
        prev = caller.run(world, "ADD", net(world))
        assert "192.168.0.0/16 via 10.60.0.1" in sh("ip", "route", ns=world.pod)
        kind, value = outcome(caller.run, world, "CHECK", net(world), prev=prev)
        if flavor == "ref":
            assert kind == "error" and "not found in routing table" in value[1]
        else:
            assert (kind, value) == ("ok", None)


# -- DEL -------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["netns-gone", "no-netns", "link-gone"])
def test_del_tolerates_what_the_reference_tolerates(
    how: str, worlds: Callable[..., dict[str, World]], bin_dir: Path
) -> None:
    ws = worlds()
    states = {}
    for flavor, world in ws.items():
        caller = Caller(flavor, bin_dir)
        net = HL_NET(world)
        prev = caller.run(world, "ADD", net)
        netns = None
        if how == "netns-gone":
            sh("ip", "netns", "del", world.pod)
            world.namespaces.remove(world.pod)
        elif how == "no-netns":
            netns = ""
        else:
            sh("ip", "link", "del", "eth0", ns=world.pod)
        for _ in range(2):
            caller.run(world, "DEL", net, prev=prev, netns=netns)
        assert world.reserved_ips() == []
        states[flavor] = pod_state(world) if how != "netns-gone" else {}
    # Without CNI_NETNS only IPAM is released: the link stays until the netns goes.
    assert states["exec"] == states["ref"] and states["inproc"] == states["ref"]


HL_NET = macvlan(ipam=HL)


@pytest.mark.parametrize("how", ["master-gone", "master-mtu-lowered"])
def test_del_succeeds_where_the_reference_fails(
    how: str, worlds: Callable[..., dict[str, World]], bin_dir: Path
) -> None:
    """Deliberate difference: 1.1.1's DEL runs loadConf, so it fails (999) when the master is
    gone ("Link not found") or now has a smaller MTU than the config's, and releases nothing.
    Ours never looks at the master on DEL: DEL must be idempotent and succeed once the
    resources are gone (CNI spec), so the IP is released and nothing is left."""
    ws = worlds()
    net = macvlan(mtu=1500, ipam=HL)
    errors = {}
    for flavor, world in ws.items():
        caller = Caller(flavor, bin_dir)
        prev = caller.run(world, "ADD", net(world))
        assert world.reserved_ips() != []
        if how == "master-gone":  # the macvlan goes with its master
            sh("ip", "link", "del", "up0", ns=world.host)
        else:
            sh("ip", "link", "set", "up0", "mtu", "1400", ns=world.host)
        for _ in range(2):
            kind, value = outcome(caller.run, world, "DEL", net(world), prev=prev)
            if flavor == "ref":
                assert kind == "error", value
                errors[flavor] = value
            else:
                assert (kind, value) == ("ok", None), (flavor, value)
        if flavor == "ref":
            assert world.reserved_ips() != []  # what the refused DEL leaves behind
            continue
        assert world.reserved_ips() == [], flavor
        assert world.links(world.pod) == ["lo"], flavor
    want = (
        "Link not found"
        if how == "master-gone"
        else "invalid MTU 1500, must be [0, master MTU(1400)]"
    )
    assert errors["ref"] == (PLUGIN_ERROR, want)


def test_add_into_a_missing_netns(worlds: Callable[..., dict[str, World]], bin_dir: Path) -> None:
    """Deliberate difference: ours fail with code 3 (unknown container) naming the path, the
    reference with 999 "failed to open netns". Nothing is created, on the host, in IPAM or
    at the path."""
    ws = worlds()
    for flavor, world in ws.items():
        gone = f"/run/netns/{PREFIX}-{world.tag}-gone"
        kind, value = outcome(Caller(flavor, bin_dir).run, world, "ADD", HL_NET(world), netns=gone)
        assert kind == "error", value
        code, msg = value
        if flavor == "ref":
            assert code == PLUGIN_ERROR and msg.startswith("failed to open netns"), value
        else:
            assert (code, gone in msg) == (ErrorCode.UNKNOWN_CONTAINER, True), value
        assert not os.path.lexists(gone)
        assert world.links(world.host) == ["lo", "up0", "up1"]
        assert world.links(world.pod) == ["lo"]
        assert world.reserved_ips() == []


def test_an_ifname_taken_in_the_pod(worlds: Callable[..., dict[str, World]], bin_dir: Path) -> None:
    """Ours create the link under its final name (the reference: a temporary one, then a
    rename), so the same failure is reported at the create: 999 both, the reference's
    `failed to rename macvlan to "eth0": file exists`, ours `failed to create macvlan
    "eth0": file exists`. Neither touches the link in the way nor reserves an address."""
    ws = worlds()
    for flavor, world in ws.items():
        sh("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "peer0", ns=world.pod)
        kind, value = outcome(Caller(flavor, bin_dir).run, world, "ADD", HL_NET(world))
        assert kind == "error", value
        code, msg = value
        assert code == PLUGIN_ERROR, value
        if flavor == "ref":
            assert msg == 'failed to rename macvlan to "eth0": file exists', value
        else:
            assert msg == 'failed to create macvlan "eth0": file exists', value
        assert world.links(world.pod) == ["eth0", "lo", "peer0"]
        assert world.links(world.host) == ["lo", "up0", "up1"]
        assert world.reserved_ips() == []


def test_source_mode_is_ours_only(worlds: Callable[..., dict[str, World]], bin_dir: Path) -> None:
    """1.1.1 rejects mode "source"; the kernel has it and so do we."""
    ws = worlds()
    net = macvlan(mode="source")
    kind, err = outcome(lambda: Caller("ref", bin_dir).run(ws["ref"], "ADD", net(ws["ref"])))
    assert (kind, err) == ("error", (999, 'unknown macvlan mode: "source"'))
    for flavor in ("exec", "inproc"):
        world = ws[flavor]
        prev = Caller(flavor, bin_dir).run(world, "ADD", net(world))
        assert pod_state(world)["mode"] == "source"
        Caller(flavor, bin_dir).run(world, "CHECK", net(world), prev=prev)
        Caller(flavor, bin_dir).run(world, "DEL", net(world), prev=prev)


def test_bcqueuelen_is_ours_only(worlds: Callable[..., dict[str, World]], bin_dir: Path) -> None:
    """`bcqueuelen` (later reference versions) sets the macvlan broadcast queue length when
    the link is created; 0 leaves the kernel's default and CHECK does not compare it, as
    upstream. 1.1.1 does not know the field: it ignores it, also when negative."""
    ws = worlds()
    ref, ours = ws["ref"], {f: ws[f] for f in ("exec", "inproc")}
    for ignored in (2345, -1):
        net = macvlan(bcqueuelen=ignored, ipam=HL)
        prev = Caller("ref", bin_dir).run(ref, "ADD", net(ref))
        assert pod_state(ref)["bcqueuelen"] == KERNEL_BCQUEUELEN
        Caller("ref", bin_dir).run(ref, "DEL", net(ref), prev=prev)
    for flavor, world in ours.items():
        caller = Caller(flavor, bin_dir)
        for value, want in ((2345, 2345), (0, KERNEL_BCQUEUELEN), (None, KERNEL_BCQUEUELEN)):
            net = macvlan(bcqueuelen=value, ipam=HL)
            prev = caller.run(world, "ADD", net(world))
            shown = json.loads(sh("ip", "-d", "-j", "link", "show", "eth0", ns=world.pod))
            assert shown[0]["linkinfo"]["info_data"]["bcqueuelen"] == want, (flavor, value)
            assert pod_state(world)["bcqueuelen"] == want
            caller.run(world, "CHECK", macvlan(bcqueuelen=7, ipam=HL)(world), prev=prev)
            caller.run(world, "DEL", net(world), prev=prev)
            assert world.links(world.pod) == ["lo"] and world.reserved_ips() == []
        kind, err = outcome(caller.run, world, "ADD", macvlan(bcqueuelen=-1, ipam=HL)(world))
        assert (kind, err) == (
            "error",
            (
                PLUGIN_ERROR,
                "failed to load netconf: json: cannot unmarshal number -1 into Go struct "
                "field NetConf.bcqueuelen of type uint32",
            ),
        )
        assert world.links(world.pod) == ["lo"] and world.reserved_ips() == []
