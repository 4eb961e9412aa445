"""The in-process host-local and static IPAMs against the reference binaries (v1.1.1).

Every scenario runs the same steps through the reference binary and through
delegates.ipam on two fresh data dirs, and after each step compares the outcome (the
result JSON, or the error message) and the data dirs (names, modes and contents).
Error codes differ deliberately: where the reference reports 999, ours is one of the spec
codes documented in delegates.ipam.common (SPEC_CODES); any other code must be equal.
"""

from __future__ import annotations

import copy
import json
import os
import random
import stat
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from ipaddress import IPv4Address, IPv4Interface
from pathlib import Path
from typing import Any

import pytest

from cni.env import CmdArgs, parse_cni_args
from cni.errors import CNIError
from cni.skel import UNEXPECTED_ERROR
from delegates.ipam.dispatch import ipam_add, ipam_check, ipam_del

REFERENCE = Path("/usr/lib/cni")
DATA = "@DATA"  # replaced by each side's own data dir
REFERENCE_CODE = 999  # what the reference reports for (nearly) every failure of its own
SPEC_CODES = {4, 5, 7, 11, 100}  # ours instead, as documented in delegates.ipam.common

pytestmark = pytest.mark.netns
for _plugin in ("host-local", "static"):
    if not os.access(REFERENCE / _plugin, os.X_OK):
        pytest.skip(f"reference plugin {REFERENCE / _plugin} is missing", allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("needs root to create a network namespace", allow_module_level=True)


@pytest.fixture(scope="module")
def netns() -> Iterator[str]:
    """A real (empty) network namespace for CNI_NETNS; the reference's skel requires one."""
    name = f"pxt-ipam-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield f"/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


Outcome = tuple[str, Any]


class Twins:
    """Runs each step on the reference binary and in process, on separate data dirs."""

    def __init__(self, root: Path, netns: str) -> None:
        self.netns = netns
        self.dirs = {"ref": root / "ref", "ours": root / "ours"}
        self.codes: dict[str, int] = {}  # the error code of each side's last step

    def conf(self, conf: dict[str, Any], side: str) -> dict[str, Any]:
        text = json.dumps(conf).replace(DATA, str(self.dirs[side]))
        out: dict[str, Any] = json.loads(text)
        return out

    def reference(
        self, verb: str, conf: dict[str, Any], cid: str, ifname: str, args: str
    ) -> Outcome:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CNI_COMMAND": verb,
            "CNI_CONTAINERID": cid,
            "CNI_NETNS": self.netns,
            "CNI_IFNAME": ifname,
            "CNI_PATH": str(REFERENCE),
            "CNI_ARGS": args,
        }
        plugin = REFERENCE / conf["ipam"]["type"]
        stdin = json.dumps(self.conf(conf, "ref"))
        done = subprocess.run(
            [str(plugin)], input=stdin, env=env, capture_output=True, text=True, timeout=30
        )
        out = json.loads(done.stdout) if done.stdout.strip() else None
        if done.returncode != 0:
            assert out is not None, done.stderr
            self.codes["ref"] = out["code"]
            return ("error", out["msg"])
        return ("ok", out)

    def ours(self, verb: str, conf: dict[str, Any], cid: str, ifname: str, args: str) -> Outcome:
        cmd = CmdArgs(verb, cid, self.netns, ifname, parse_cni_args(args), (str(REFERENCE),), b"")
        mine = self.conf(conf, "ours")
        try:
            if verb == "ADD":
                return ("ok", ipam_add(mine, cmd).to_dict(conf["cniVersion"]))
            {"DEL": ipam_del, "CHECK": ipam_check}[verb](mine, cmd)
        except CNIError as err:
            assert err.code != UNEXPECTED_ERROR
            self.codes["ours"] = err.code
            return ("error", err.msg)
        return ("ok", None)

    def step(
        self,
        verb: str,
        conf: dict[str, Any],
        cid: str = "c1",
        ifname: str = "eth0",
        args: str = "",
    ) -> Outcome:
        self.codes.clear()
        ref = self.reference(verb, conf, cid, ifname, args)
        ours = self.ours(verb, conf, cid, ifname, args)
        assert ours == ref, f"{verb} {cid}/{ifname} args={args!r}"
        if ref[0] == "error":
            ref_code, our_code = self.codes["ref"], self.codes["ours"]
            if ref_code == REFERENCE_CODE:
                assert our_code in SPEC_CODES, (ref, self.codes)
            else:
                assert our_code == ref_code, (ref, self.codes)
        assert snapshot(self.dirs["ours"]) == snapshot(self.dirs["ref"]), f"{verb} {cid}"
        return ref

    def seed(self, relpath: str, content: str) -> None:
        for directory in self.dirs.values():
            path = directory / relpath
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file and dir under `root`: relative path -> (mode, content)."""
    out: dict[str, tuple[int, bytes]] = {}
    if not root.exists():
        return out
    for path in root.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        out[str(path.relative_to(root))] = (mode, b"" if path.is_dir() else path.read_bytes())
    return out


@pytest.fixture
def twins(tmp_path: Path, netns: str) -> Twins:
    return Twins(tmp_path, netns)


def host_local(version: str = "1.0.0", name: str = "net", **ipam: Any) -> dict[str, Any]:
    return {
        "cniVersion": version,
        "name": name,
        "type": "macvlan",
        "ipam": {"type": "host-local", "dataDir": DATA, **ipam},
    }


def static(version: str = "1.0.0", **ipam: Any) -> dict[str, Any]:
    return {
        "cniVersion": version,
        "name": "snet",
        "type": "macvlan",
        "ipam": {"type": "static", **ipam},
    }


def with_top(conf: dict[str, Any], **top: Any) -> dict[str, Any]:
    out = copy.deepcopy(conf)
    out.update(top)
    return out


# -- host-local scenarios ---------------------------------------------------------------


def test_single_legacy_range_lifecycle(twins: Twins) -> None:
    conf = host_local(subnet="10.1.2.0/29", routes=[{"dst": "0.0.0.0/0"}])
    for i in range(1, 6):  # .2-.6: no network, gateway or broadcast address
        assert twins.step("ADD", conf, cid=f"c{i}")[0] == "ok"
    assert twins.step("ADD", conf, cid="c9")[0] == "error"  # exhausted
    twins.step("CHECK", conf, cid="c1")
    assert twins.step("CHECK", conf, cid="c9")[0] == "error"
    twins.step("DEL", conf, cid="c2")
    twins.step("DEL", conf, cid="c2")
    twins.step("ADD", conf, cid="c7")  # round robin wraps to the freed .3
    assert twins.step("ADD", conf, cid="c1")[0] == "error"  # duplicate allocation
    assert twins.step("ADD", conf, cid="c1", ifname="net1")[0] == "error"  # new key, but full
    twins.step("DEL", conf, cid="c1")
    twins.step("ADD", conf, cid="c1", ifname="net1")


def test_range_start_end_and_gateway_inside(twins: Twins) -> None:
    conf = host_local(
        subnet="10.2.0.0/24", rangeStart="10.2.0.10", rangeEnd="10.2.0.13", gateway="10.2.0.11"
    )
    for i in range(4):
        twins.step("ADD", conf, cid=f"c{i}")
    twins.step("DEL", conf, cid="c0")
    twins.step("ADD", conf, cid="c5")


def test_several_ranges_in_one_set(twins: Twins) -> None:
    conf = host_local(
        ranges=[
            [
                {"subnet": "10.3.0.0/30"},
                {"subnet": "10.3.1.0/29", "rangeStart": "10.3.1.5"},
                {"subnet": "10.3.2.0/30", "gateway": "10.3.2.2"},
            ]
        ],
    )
    for i in range(6):
        twins.step("ADD", conf, cid=f"c{i}")
    for i in (0, 2, 4):
        twins.step("DEL", conf, cid=f"c{i}")
    for i in range(6, 10):
        twins.step("ADD", conf, cid=f"c{i}")


def test_dual_stack_with_routes(twins: Twins) -> None:
    conf = host_local(
        ranges=[
            [{"subnet": "10.4.0.0/24", "gateway": "10.4.0.254"}],
            [{"subnet": "fd00:4::/120", "rangeStart": "fd00:4::10", "rangeEnd": "fd00:4::12"}],
        ],
        routes=[{"dst": "0.0.0.0/0"}, {"dst": "::/0", "gw": "fd00:4::1"}],
    )
    for i in range(4):  # the v6 set runs out on the 4th: the v4 address is given back
        twins.step("ADD", conf, cid=f"c{i}")
    twins.step("ADD", conf, cid="c0", ifname="eth1")
    twins.step("DEL", conf, cid="c1")
    twins.step("ADD", conf, cid="c0", ifname="eth1")
    twins.step("CHECK", conf, cid="c0", ifname="eth1")


def test_ipv6_only_and_round_robin_from_last_reserved(twins: Twins) -> None:
    conf = host_local(ranges=[[{"subnet": "fd00:5::/64"}]])
    twins.seed("net/last_reserved_ip.0", "fd00:5::ffff:ffff:ffff:fffe")
    for i in range(3):  # ::ffff..fffe + 1, then wrap to ::2
        twins.step("ADD", conf, cid=f"c{i}")


def test_requested_ip_runtime_config(twins: Twins) -> None:
    base = host_local(subnet="10.6.0.0/24")
    want = with_top(base, runtimeConfig={"ips": ["10.6.0.50/24"]})
    twins.step("ADD", want, cid="c1")
    assert twins.step("ADD", want, cid="c2")[0] == "error"  # taken
    twins.step("DEL", base, cid="c1")
    twins.step("ADD", want, cid="c2")
    twins.step("ADD", with_top(base, runtimeConfig={"ips": ["10.6.0.51"]}), cid="c3")
    gateway = with_top(base, runtimeConfig={"ips": ["10.6.0.1"]})
    assert twins.step("ADD", gateway, cid="c4")[0] == "error"
    outside = with_top(base, runtimeConfig={"ips": ["10.99.0.1"]})
    assert twins.step("ADD", outside, cid="c4")[0] == "error"
    assert twins.step("ADD", with_top(base, runtimeConfig={"ips": ["bad"]}), cid="c4")[0] == "error"


def test_requested_ip_cni_args_and_args_cni(twins: Twins) -> None:
    conf = host_local(subnet="10.7.0.0/24")
    k8s = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=c1"
    twins.step("ADD", conf, cid="c1", args=f"{k8s};IP=10.7.0.9")
    twins.step("ADD", conf, cid="c2", args="IP=10.7.0.10/24")
    twins.step("ADD", conf, cid="c3", args="IP=")
    twins.step("ADD", with_top(conf, args={"cni": {"ips": ["10.7.0.20"]}}), cid="c4")
    for bad in ("K8S_POD_NAME=p", "IP=nope", "IgnoreUnknown=maybe", "IP=10.7.0.9", "a=b=c"):
        assert twins.step("ADD", conf, cid="c5", args=bad)[0] == "error"
    twins.step("DEL", conf, cid="c1", args=k8s)


def test_resolv_conf_and_routes(twins: Twins, tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(
        "# comment\nnameserver 10.0.0.53\nnameserver 10.0.1.53 x\ndomain example.org\n"
        "search a.example b.example\nsearch c.example\noptions ndots:5 rotate\n;x\nbogus\n"
    )
    conf = host_local(
        subnet="10.8.0.0/16",
        rangeStart="10.8.1.0",
        resolvConf=str(resolv),
        routes=[{"dst": "10.9.0.0/16", "gw": "10.8.0.254"}, {"dst": "0.0.0.0/0"}],
    )
    twins.step("ADD", conf, cid="c1")
    missing = host_local(subnet="10.8.0.0/16", resolvConf=str(tmp_path / "nope"))
    assert twins.step("ADD", missing, cid="c2")[0] == "error"


@pytest.mark.parametrize("version", ["0.2.0", "0.3.1", "0.4.0"])
def test_older_versions(twins: Twins, version: str) -> None:
    conf = host_local(
        version,
        ranges=[[{"subnet": "10.10.0.0/24"}], [{"subnet": "fd00:10::/64"}]],
        routes=[{"dst": "0.0.0.0/0"}],
    )
    twins.step("ADD", conf, cid="c1")
    if version == "0.4.0":
        twins.step("CHECK", conf, cid="c1")
    twins.step("DEL", conf, cid="c1")


def test_ip_ranges_capability_and_legacy_plus_ranges(twins: Twins) -> None:
    conf = host_local(subnet="10.11.0.0/24", ranges=[[{"subnet": "10.12.0.0/24"}]])
    twins.step("ADD", conf, cid="c1")
    caps = with_top(conf, runtimeConfig={"ipRanges": [[{"subnet": "10.13.0.0/24"}]]})
    twins.step("ADD", caps, cid="c2")
    twins.step("DEL", caps, cid="c2")


def test_old_format_reservations(twins: Twins) -> None:
    conf = host_local(subnet="10.14.0.0/24")
    twins.seed("net/10.14.0.7", "old1")
    twins.seed("net/last_reserved_ip.0", "10.14.0.6")
    twins.step("ADD", conf, cid="c1")  # .7 is taken: .8
    twins.step("CHECK", conf, cid="old1")
    assert twins.step("ADD", conf, cid="old1")[0] == "error"  # it already holds .7
    twins.step("DEL", conf, cid="old1")


BAD_HOST_LOCAL: list[dict[str, Any]] = [
    {"subnet": "10.1.2.3/24"},
    {"subnet": "10.1.2.0/31"},
    {"subnet": "bogus"},
    {"subnet": "10.1.2.0/24", "gateway": "bogus"},
    {"subnet": "10.1.2.0/24", "rangeStart": "10.1.3.5"},
    {"subnet": "10.1.2.0/24", "rangeEnd": "10.1.3.5"},
    {"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.50", "rangeEnd": "10.1.2.40"},
    {},
    {"ranges": [[]]},
    {"ranges": [[{"rangeStart": "10.1.2.5"}]]},
    {"ranges": [[{"subnet": "10.1.2.0/24"}, {"subnet": "fd00::/64"}]]},
    {"ranges": [[{"subnet": "10.1.2.0/24"}, {"subnet": "10.1.2.0/25"}]]},
    {"ranges": [[{"subnet": "10.1.2.0/24"}], [{"subnet": "10.1.2.128/25"}]]},
    {"subnet": "10.1.2.0/24", "routes": [{"dst": "bogus"}]},
]


@pytest.mark.parametrize("ipam", BAD_HOST_LOCAL, ids=[json.dumps(b) for b in BAD_HOST_LOCAL])
def test_invalid_host_local_configs(twins: Twins, ipam: dict[str, Any]) -> None:
    conf = host_local(**ipam)
    for verb in ("ADD", "DEL", "CHECK"):
        assert twins.step(verb, conf)[0] == "error"


def test_two_v4_range_sets_need_version_0_3(twins: Twins) -> None:
    conf = host_local("0.2.0", ranges=[[{"subnet": "10.1.2.0/24"}], [{"subnet": "10.1.3.0/24"}]])
    assert twins.step("ADD", conf)[0] == "error"


# -- static -----------------------------------------------------------------------------

ADDRESSES = [
    {"address": "10.20.0.1/24", "gateway": "10.20.0.254"},
    {"address": "3ffe:ffff:0:01ff::1/64", "gateway": "3ffe:ffff:0::1"},
]


@pytest.mark.parametrize("version", ["0.2.0", "0.3.1", "0.4.0", "1.0.0"])
def test_static_routes_and_dns(twins: Twins, version: str) -> None:
    conf = static(
        version,
        addresses=ADDRESSES,
        routes=[{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.20.0.5"}],
        dns={"nameservers": ["8.8.8.8"], "domain": "example.com", "search": ["example.com"]},
    )
    outcome = twins.step("ADD", conf)
    if version in ("0.4.0", "1.0.0"):
        checked = with_top(conf, prevResult=outcome[1])
        twins.step("CHECK", checked)
    twins.step("DEL", conf)


def test_static_cni_args_and_capabilities(twins: Twins) -> None:
    conf = static(addresses=[{"address": "10.21.0.1/24"}])
    twins.step("ADD", conf, args="IP=10.21.0.5/24, fd00:21::5/64;GATEWAY=10.21.0.254,fd00:21::1")
    twins.step("ADD", conf, args="IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.21.0.6/24")
    cni_args = with_top(conf, args={"cni": {"ips": ["10.21.0.7/24"]}})
    twins.step("ADD", cni_args, args="GATEWAY=10.21.0.254")
    both = with_top(cni_args, runtimeConfig={"ips": ["10.21.0.8/24", "fd00:21::8/64"]})
    twins.step("ADD", both)
    for bad in ("IP=10.21.0.5", "GATEWAY=bogus", "FOO=1"):
        assert twins.step("ADD", conf, args=bad)[0] == "error"
    assert twins.step("ADD", with_top(conf, runtimeConfig={"ips": ["10.21.0.8"]}))[0] == "error"


def test_static_errors_and_check(twins: Twins) -> None:
    assert twins.step("ADD", static(addresses=[{"address": "10.22.0.1"}]))[0] == "error"
    bad_gw = static(addresses=[{"address": "10.22.0.1/24", "gateway": "x"}])
    assert twins.step("ADD", bad_gw)[0] == "error"
    two = static("0.2.0", addresses=[{"address": "10.22.0.1/24"}, {"address": "10.22.1.1/24"}])
    assert twins.step("ADD", two)[0] == "error"
    twins.step("DEL", static(addresses=[{"address": "bogus"}]))
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.22.0.1/24", "gateway": "10.22.0.254"}]}
    conf = static(addresses=[{"address": "10.22.0.1/24", "gateway": "10.22.0.254"}])
    assert twins.step("CHECK", conf)[0] == "error"  # no prevResult
    twins.step("CHECK", with_top(conf, prevResult=prev))
    other_gw = static(addresses=[{"address": "10.22.0.1/24", "gateway": "10.22.0.1"}])
    assert twins.step("CHECK", with_top(other_gw, prevResult=prev))[0] == "error"
    absent = static(addresses=[{"address": "10.22.0.2/24"}])
    twins.step("CHECK", with_top(absent, prevResult=prev))


# -- one range shared by the reference binary and us ------------------------------------


def test_shared_range_concurrent_allocation(tmp_path: Path, netns: str) -> None:
    """20 reference execs and 20 in-process ADDs race for a 40-address range."""
    twins = Twins(tmp_path, netns)
    twins.dirs["ref"] = twins.dirs["ours"]  # one data dir for both
    conf = host_local(subnet="10.77.0.0/24", rangeStart="10.77.0.10", rangeEnd="10.77.0.49")
    jobs = [("ref", f"ref{i}") for i in range(20)] + [("ours", f"our{i}") for i in range(20)]
    random.Random(7).shuffle(jobs)

    def run(verb: str, side: str, cid: str) -> Outcome:
        call = twins.reference if side == "ref" else twins.ours
        return call(verb, conf, cid, "eth0", "")

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        added = list(pool.map(lambda job: run("ADD", *job), jobs))
    assert all(kind == "ok" for kind, _ in added), added
    ips = [IPv4Interface(out["ips"][0]["address"]).ip for _, out in added]
    assert sorted(ips) == [IPv4Address(f"10.77.0.{i}") for i in range(10, 50)]  # no duplicates
    network = twins.dirs["ours"] / "net"
    for (_, cid), ip in zip(jobs, ips, strict=True):
        assert (network / str(ip)).read_bytes() == f"{cid}\r\neth0".encode()
    assert run("ADD", "ref", "late1")[0] == "error"
    assert run("ADD", "ours", "late2")[0] == "error"

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        deleted = list(pool.map(lambda job: run("DEL", *job), jobs))
    assert all(kind == "ok" for kind, _ in deleted), deleted
    assert sorted(p.name for p in network.iterdir()) == ["last_reserved_ip.0", "lock"]
