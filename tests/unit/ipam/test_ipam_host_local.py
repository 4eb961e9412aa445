"""In-process host-local on real data dirs (tmp_path): allocation, release, check, gc."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from delegates.ipam.common import CHECK_FAILED
from delegates.ipam.dispatch import ipam_add, ipam_check, ipam_del, ipam_gc


def cmd(cid: str = "c1", ifname: str = "eth0", args: tuple[tuple[str, str], ...] = ()) -> CmdArgs:
    return CmdArgs("ADD", cid, "/run/netns/x", ifname, args, ("/nonexistent",), b"")


def conf(tmp_path: Path, version: str = "1.1.0", top: Any = None, **ipam: Any) -> dict[str, Any]:
    out = {
        "cniVersion": version,
        "name": "net",
        "type": "macvlan",
        "ipam": {"type": "host-local", "dataDir": str(tmp_path), **ipam},
    }
    out.update(top or {})
    return out


def add(c: dict[str, Any], cid: str = "c1", ifname: str = "eth0", **kw: Any) -> list[str]:
    return [str(ip.address) for ip in ipam_add(c, cmd(cid, ifname, **kw)).ips]


def files(tmp_path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (tmp_path / "net").iterdir()}


def error(c: dict[str, Any], cid: str = "c1", fn: Any = ipam_add, **kw: Any) -> CNIError:
    with pytest.raises(CNIError) as err:
        fn(c, cmd(cid, **kw))
    return err.value


def test_first_add_result_and_files(tmp_path: Path) -> None:
    c = conf(tmp_path, subnet="10.1.2.0/24", routes=[{"dst": "0.0.0.0/0"}])
    result = ipam_add(c, cmd())
    assert result.to_dict("1.1.0") == {
        "cniVersion": "1.1.0",
        "ips": [{"address": "10.1.2.2/24", "gateway": "10.1.2.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {},
    }
    assert result.interfaces == [] and result.ips[0].interface is None
    assert files(tmp_path) == {
        "10.1.2.2": b"c1\r\neth0",
        "last_reserved_ip.0": b"10.1.2.2",
        "lock": b"",
    }
    assert (tmp_path / "net" / "lock").stat().st_mode & 0o777 == 0o750


def test_round_robin_exhaustion_and_reuse(tmp_path: Path) -> None:
    c = conf(tmp_path, subnet="10.1.2.0/29")
    got = [add(c, f"c{i}")[0] for i in range(5)]
    assert got == [f"10.1.2.{i}/29" for i in range(2, 7)]  # no .0, .1 (gateway), .7
    err = error(c, "c9")
    assert err.code == ErrorCode.TRY_AGAIN_LATER
    assert err.msg == (
        "failed to allocate for range 0: no IP addresses available in range set: 10.1.2.1-10.1.2.6"
    )
    ipam_del(c, cmd("c1"))  # frees .3
    ipam_del(c, cmd("c1"))  # idempotent
    assert add(c, "c7") == ["10.1.2.3/29"]


def test_duplicate_add_fails_other_ifname_gets_another(tmp_path: Path) -> None:
    c = conf(tmp_path, subnet="10.1.2.0/24")
    add(c)
    err = error(c)
    assert err.code == ErrorCode.TRY_AGAIN_LATER
    assert "10.1.2.2 has been allocated to c1, duplicate allocation is not allowed" in err.msg
    assert add(c, ifname="net1") == ["10.1.2.3/24"]
    ipam_del(c, cmd(ifname="net1"))
    assert sorted(files(tmp_path)) == ["10.1.2.2", "last_reserved_ip.0", "lock"]


def test_dual_stack_and_partial_failure_releases(tmp_path: Path) -> None:
    c = conf(
        tmp_path,
        ranges=[
            [{"subnet": "10.1.2.0/24"}],
            [{"subnet": "fd00::/120", "rangeStart": "fd00::10", "rangeEnd": "fd00::10"}],
        ],
    )
    assert add(c) == ["10.1.2.2/24", "fd00::10/120"]
    assert files(tmp_path)["last_reserved_ip.1"] == b"fd00::10"
    err = error(c, "c2")  # v4 works, v6 is full: the v4 address is released again
    assert err.msg.startswith("failed to allocate for range 1: no IP addresses available")
    assert sorted(n for n in files(tmp_path) if n[0].isdigit() or ":" in n) == [
        "10.1.2.2",
        "fd00::10",
    ]


def test_multiple_ranges_in_one_set(tmp_path: Path) -> None:
    c = conf(tmp_path, ranges=[[{"subnet": "10.1.0.0/30"}, {"subnet": "10.1.1.0/30"}]])
    assert [add(c, f"c{i}")[0] for i in range(2)] == ["10.1.0.2/30", "10.1.1.2/30"]
    assert error(c, "c3").msg.endswith("range set: 10.1.0.1-10.1.0.2,10.1.1.1-10.1.1.2")


def test_requested_ips_from_every_source(tmp_path: Path) -> None:
    c = conf(tmp_path, subnet="10.1.2.0/24")
    assert add(c, "a", args=(("IP", "10.1.2.40"),)) == ["10.1.2.40/24"]
    assert add(c, "b", args=(("IP", "10.1.2.41/24"),)) == ["10.1.2.41/24"]
    c_args = conf(tmp_path, top={"args": {"cni": {"ips": ["10.1.2.42"]}}}, subnet="10.1.2.0/24")
    assert add(c_args, "c") == ["10.1.2.42/24"]
    c_caps = conf(tmp_path, top={"runtimeConfig": {"ips": ["10.1.2.43/24"]}}, subnet="10.1.2.0/24")
    assert add(c_caps, "d") == ["10.1.2.43/24"]
    taken = error(c_caps, "e")
    assert taken.code == ErrorCode.TRY_AGAIN_LATER
    assert taken.msg == (
        "failed to allocate for range 0: requested IP address 10.1.2.43 is not available in "
        "range set 10.1.2.1-10.1.2.254"
    )
    gateway = error(c, "f", args=(("IP", "10.1.2.1"),))
    assert gateway.code == ErrorCode.INVALID_CONFIG
    assert gateway.msg.endswith("requested ip 10.1.2.1 is subnet's gateway")
    outside = error(c, "g", args=(("IP", "10.9.0.1"),))
    assert outside.code == ErrorCode.INVALID_CONFIG
    assert outside.msg == "failed to allocate all requested IPs: 10.9.0.1"
    assert not (tmp_path / "net" / "10.1.2.2").exists()  # nothing leaked by the failures


def test_requested_ip_per_range_set(tmp_path: Path) -> None:
    c = conf(
        tmp_path,
        top={"runtimeConfig": {"ips": ["fd00::7", "10.1.2.9"]}},
        ranges=[[{"subnet": "10.1.2.0/24"}], [{"subnet": "fd00::/64"}]],
    )
    assert add(c) == ["10.1.2.9/24", "fd00::7/64"]


def test_cni_args_need_ignore_unknown(tmp_path: Path) -> None:
    c = conf(tmp_path, subnet="10.1.2.0/24")
    err = error(c, args=(("K8S_POD_NAME", "p"),))
    assert err.code == ErrorCode.INVALID_ENV
    assert add(c, args=(("IgnoreUnknown", "1"), ("K8S_POD_NAME", "p"))) == ["10.1.2.2/24"]


def test_check(tmp_path: Path) -> None:
    c = conf(tmp_path, subnet="10.1.2.0/24")
    add(c)
    ipam_check(c, cmd())
    err = error(c, "c2", fn=ipam_check)
    assert err.code == CHECK_FAILED
    assert err.msg == "host-local: Failed to find address added by container c2"
    old = conf(tmp_path, "0.3.1", subnet="10.1.2.0/24")
    assert error(old, fn=ipam_check).code == ErrorCode.INCOMPATIBLE_VERSION


def test_old_format_files_match_the_container(tmp_path: Path) -> None:
    c = conf(tmp_path, subnet="10.1.2.0/24")
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "10.1.2.2").write_text("legacy\n")
    ipam_check(c, cmd("legacy", "anything"))
    assert add(c, "new") == ["10.1.2.3/24"]
    ipam_del(c, cmd("legacy", "anything"))
    assert not (tmp_path / "net" / "10.1.2.2").exists()


def test_gc_keeps_only_valid_attachments(tmp_path: Path) -> None:
    c = conf(tmp_path, subnet="10.1.2.0/24")
    for cid, ifname in (("a", "eth0"), ("a", "net1"), ("b", "eth0")):
        add(c, cid, ifname)
    (tmp_path / "net" / "10.1.2.9").write_text("a")  # old format, container still valid
    valid = [{"containerID": "a", "ifname": "eth0"}]
    ipam_gc({**c, "cni.dev/valid-attachments": valid}, cmd(""))
    assert sorted(files(tmp_path)) == ["10.1.2.2", "10.1.2.9", "last_reserved_ip.0", "lock"]


def test_resolv_conf(tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 1.1.1.1\n# x\ndomain d.example\nsearch a b\noptions ndots:2\n")
    c = conf(tmp_path, subnet="10.1.2.0/24", resolvConf=str(resolv))
    dns = ipam_add(c, cmd()).dns
    assert (dns.nameservers, dns.domain, dns.search, dns.options) == (
        ["1.1.1.1"],
        "d.example",
        ["a", "b"],
        ["ndots:2"],
    )
    missing = conf(tmp_path, subnet="10.1.2.0/24", resolvConf=str(tmp_path / "nope"))
    err = error(missing)
    assert err.code == ErrorCode.IO_FAILURE
    assert err.msg.endswith("nope: no such file or directory")


@pytest.mark.parametrize(
    ("ipam", "message", "details"),
    [
        ({"subnet": "bogus"}, "invalid CIDR address: bogus", "field ipam.subnet"),
        (
            {"ranges": [[{"subnet": "10.0.0.0/8", "gateway": "x"}]]},
            "invalid IP address: x",
            "field ipam.ranges.0.0.gateway",
        ),
        ({}, "no IP ranges specified", ""),
        ({"ranges": [[]]}, "invalid range set 0: empty range set", ""),
        (
            {"subnet": "10.0.0.0/24", "ranges": [[{"subnet": "10.0.0.0/25"}]]},
            "range set 0 overlaps with 1",
            "",
        ),
    ],
)
def test_invalid_config(tmp_path: Path, ipam: dict[str, Any], message: str, details: str) -> None:
    err = error(conf(tmp_path, **ipam))
    assert (err.code, err.msg, err.details) == (ErrorCode.INVALID_CONFIG, message, details)
    assert not (tmp_path / "net").exists()


def test_missing_name_and_old_version(tmp_path: Path) -> None:
    c = conf(tmp_path, subnet="10.1.2.0/24")
    assert error({**c, "name": ""}).msg == "missing network name"
    two = conf(tmp_path, "0.2.0", ranges=[[{"subnet": "10.1.2.0/24"}], [{"subnet": "10.1.3.0/24"}]])
    assert error(two).msg == "CNI version 0.2.0 does not support more than 1 address per family"
    legacy = conf(tmp_path, "0.2.0", subnet="10.1.2.0/24")
    assert ipam_add(legacy, cmd()).to_dict("0.2.0")["ip4"] == {
        "ip": "10.1.2.2/24",
        "gateway": "10.1.2.1",
    }


def test_parallel_threads_never_share_an_address(tmp_path: Path) -> None:
    c = conf(tmp_path, subnet="10.1.2.0/27")  # 29 usable addresses
    got: list[str] = []
    errors: list[CNIError] = []

    def worker(i: int) -> None:
        try:
            got.extend(add(c, f"c{i}"))
        except CNIError as err:
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(set(got)) == 29
    assert len(errors) == 3 and all(e.code == ErrorCode.TRY_AGAIN_LATER for e in errors)
