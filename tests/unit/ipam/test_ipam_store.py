"""host-local's store touches only what it must: its network's own directory, one level,
and in it only regular files of bounded size, never through a symlink; resolvConf is
read likewise, under the call's root."""

from __future__ import annotations

import contextvars
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cni import callscope
from cni.errors import CNIError, ErrorCode
from delegates.ipam.dispatch import ipam_add, ipam_del, ipam_gc
from delegates.ipam.host_local import MAX_RESOLV_CONF
from delegates.ipam.store import MAX_FILE, leases, open_store
from tests.unit.ipam.test_ipam_host_local import add, cmd, conf

KMSG = os.makedev(1, 11)
"""/dev/kmsg: reading one to its end blocks for the next kernel message."""
WAIT = 10.0


def _within(fn: Callable[[], Any]) -> Any:
    """fn(), which must return (or raise) within WAIT s: a read of a FIFO or a device
    would block for good (the thread is then left behind)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(("ok", fn()))
        except BaseException as exc:  # handed to the test
            out.append(("raised", exc))

    context = contextvars.copy_context()  # the call scope of the test, if any
    thread = threading.Thread(target=context.run, args=(run,), daemon=True)
    thread.start()
    thread.join(WAIT)
    assert out, f"{fn} still blocked after {WAIT} s"
    kind, value = out[0]
    if kind == "raised":
        raise value
    return value


@pytest.fixture
def traps(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """Network dir `net` holding a lease of c1 and, under address names, what a store
    must never open: a FIFO, a device node, a symlink to a file outside (holding c9's
    key) and a lease too big to be one."""
    c = conf(tmp_path, subnet="10.1.2.0/24")
    assert add(c) == ["10.1.2.2/24"]
    net = tmp_path / "net"
    outside = tmp_path / "outside"
    outside.write_bytes(b"c9\r\neth0")
    paths = {
        "fifo": net / "10.1.2.20",
        "device": net / "10.1.2.21",
        "symlink": net / "10.1.2.22",
        "big": net / "10.1.2.23",
        "outside": outside,
    }
    os.mkfifo(paths["fifo"])
    os.mknod(paths["device"], 0o600 | stat.S_IFCHR, KMSG)
    paths["symlink"].symlink_to(outside)
    paths["big"].write_bytes(b"c1\r\neth0" + b" " * MAX_FILE)
    try:
        yield paths
    finally:
        with open(paths["fifo"], "wb", opener=_nonblocking_writer):  # frees a blocked open
            pass


def _nonblocking_writer(path: str, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_NONBLOCK)
    except OSError:  # nobody reading: nothing to free
        return os.open(os.devnull, os.O_WRONLY)


def test_add_del_gc_never_open_fifos_devices_symlinks_or_big_files(
    tmp_path: Path, traps: dict[str, Path]
) -> None:
    c = conf(tmp_path, subnet="10.1.2.0/24")
    assert _within(lambda: add(c, cid="c2")) == ["10.1.2.3/24"]
    _within(lambda: ipam_del(c, cmd("c9")))  # would match the symlink's target
    _within(lambda: ipam_gc({**c, "cni.dev/valid-attachments": []}, cmd()))
    assert traps["outside"].read_bytes() == b"c9\r\neth0"
    left = sorted(p.name for p in (tmp_path / "net").iterdir())
    assert left == [
        "10.1.2.20",
        "10.1.2.21",
        "10.1.2.22",
        "10.1.2.23",
        "last_reserved_ip.0",
        "lock",
    ]


def test_leases_skips_what_is_not_a_lease(tmp_path: Path, traps: dict[str, Path]) -> None:
    assert _within(lambda: leases(str(tmp_path))) == [("net", "10.1.2.2", "c1", "eth0")]


@pytest.mark.parametrize("kind", ["fifo", "device", "symlink"])
def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    net = tmp_path / "net"
    net.mkdir()
    lock = net / "lock"
    if kind == "fifo":
        os.mkfifo(lock)
    elif kind == "device":
        os.mknod(lock, 0o600 | stat.S_IFCHR, KMSG)
    else:
        lock.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CNIError) as err:
        _within(lambda: open_store("net", str(tmp_path)).__enter__())
    assert (err.value.code, err.value.msg) == (5, f"host-local: cannot open the lock file {lock}")
    assert "not a regular file" in err.value.details
    assert not (tmp_path / "elsewhere").exists()


def test_the_last_reserved_ip_is_not_written_through_a_symlink(tmp_path: Path) -> None:
    c = conf(tmp_path, subnet="10.1.2.0/24")
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "last_reserved_ip.0").symlink_to(victim)
    with pytest.raises(CNIError) as err:
        ipam_add(c, cmd())
    assert err.value.code == 5
    assert err.value.msg.endswith("host-local: cannot record the last reserved IP")
    assert victim.read_bytes() == b"precious"


def test_a_network_dir_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "net").symlink_to(tmp_path / "real")
    with pytest.raises(CNIError) as err:
        add(conf(tmp_path, subnet="10.1.2.0/24"))
    assert err.value.msg == f"host-local: cannot open the data dir {tmp_path}/net"
    assert list((tmp_path / "real").iterdir()) == []


def test_a_network_nested_in_another_is_not_seen_by_it(tmp_path: Path) -> None:
    """A config may name another network's dir as its dataDir: that network's GC, DEL
    and allocation see only their own dir, not the nested network's leases."""
    outer = conf(tmp_path, subnet="10.1.2.0/24")
    inner = {**conf(tmp_path / "net", subnet="10.1.2.0/24"), "name": "inner"}
    assert add(inner, cid="c1") == ["10.1.2.2/24"]
    assert add(outer, cid="c1") == ["10.1.2.2/24"]  # it held none: no duplicate
    ipam_gc({**outer, "cni.dev/valid-attachments": []}, cmd())
    ipam_del(outer, cmd("c1"))
    assert (tmp_path / "net" / "inner" / "10.1.2.2").read_bytes() == b"c1\r\neth0"
    assert leases(str(tmp_path)) == []
    assert leases(str(tmp_path / "net")) == [("inner", "10.1.2.2", "c1", "eth0")]


@pytest.mark.parametrize("name", ["..", "a/b", "n" * 256])
def test_a_network_name_that_cannot_be_a_directory_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(CNIError) as err:
        add({**conf(tmp_path, subnet="10.1.2.0/24"), "name": name})
    assert err.value.code == ErrorCode.INVALID_CONFIG
    assert err.value.msg.startswith(f"host-local: network name {name!r} cannot name a directory")
    assert list(tmp_path.iterdir()) == []


def _resolv(tmp_path: Path, root: str = "") -> Any:
    c = conf(Path("/data"), subnet="10.1.2.0/24", resolvConf="/etc/resolv.conf")
    with callscope.call_scope() as scope:
        scope.root = root
        return _within(lambda: ipam_add(c, cmd()))


def test_resolv_conf_is_read_under_the_calls_root(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "resolv.conf").write_text("nameserver 10.0.0.53\n")
    result = _resolv(tmp_path, str(tmp_path))
    assert result.dns.nameservers == ["10.0.0.53"]
    assert (tmp_path / "data" / "net").is_dir()  # the data dir under the root too


@pytest.mark.parametrize("kind", ["fifo", "device", "symlink", "big"])
def test_resolv_conf_that_is_not_a_small_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    (tmp_path / "etc").mkdir()
    path = tmp_path / "etc" / "resolv.conf"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        os.mknod(path, 0o600 | stat.S_IFCHR, KMSG)
    elif kind == "symlink":
        (tmp_path / "secret").write_text("nameserver 10.6.6.6\n")
        path.symlink_to(tmp_path / "secret")
    else:
        path.write_text("nameserver 10.0.0.53\n" + "#" * MAX_RESOLV_CONF)
    with pytest.raises(CNIError) as err:
        _resolv(tmp_path, str(tmp_path))
    reason = "holds more than 65536 bytes" if kind == "big" else "not a regular file"
    assert err.value.code == 5 and err.value.msg.startswith(f"open /etc/resolv.conf: {reason}")
