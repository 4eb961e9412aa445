"""host-local's on-disk store, byte-compatible with the reference plugin.

Layout under `<dataDir>/<network>/` (dataDir defaults to /var/lib/cni/networks):

- `<ip>`: one file per reserved address, holding "<containerID>\\r\\n<ifname>" (files
  written by old versions hold only the container ID; they still match that container);
- `last_reserved_ip.<range set index>`: the last address reserved from that range set;
- `lock`: flock()ed exclusively around every read-modify-write, as the reference does
  (go-filemutex), so this store and the reference binary can share one directory.

A config names dataDir and the network, so the store touches only what it must: the
network's own directory, one level (never a network nested in it), and in it only
regular files, of bounded size, never through a symlink; a lease is read only if its
name is an address. A FIFO, a device node or a symlink in its place is refused (the
lock file, the last reserved IP) or skipped (a lease), never opened.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Collection, Iterator
from contextlib import contextmanager

from cni import callscope
from cni.errors import CNIError, ErrorCode
from cni.fileio import name_problem, open_regular, read_regular
from delegates.ipam.common import IPAddress, parse_ip

DEFAULT_DATA_DIR = "/var/lib/cni/networks"
LINE_BREAK = "\r\n"
LAST_IP_PREFIX = "last_reserved_ip."
LOCK_FILE = "lock"
MAX_FILE = 4096
"""Bytes a lease or last-reserved file may hold ("<containerID>\\r\\n<ifname>", an
address); a bigger one is not the store's."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _io_error(what: str, err: OSError) -> CNIError:
    return CNIError(ErrorCode.IO_FAILURE, f"host-local: cannot {what}", str(err))


def network_dir_problem(network: str) -> str | None:
    """Why `network` cannot name a directory of its own in a data dir, or None."""
    if not network or network in (".", "..") or "/" in network or "\0" in network:
        return f"network name {network!r} cannot name a directory"
    if problem := name_problem(network):
        return f"network name {network!r} cannot name a directory: {problem}"
    return None


@contextmanager
def open_store(network: str, data_dir: str = "") -> Iterator[Store]:
    """Create the network dir if needed and hold its lock while the block runs."""
    if problem := network_dir_problem(network):
        raise CNIError(ErrorCode.INVALID_CONFIG, f"host-local: {problem}")
    parent = callscope.current().on_host(data_dir or DEFAULT_DATA_DIR)
    directory = os.path.join(parent, network)
    try:
        os.makedirs(parent, 0o755, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o755)
        dir_fd = os.open(directory, _DIR)
    except OSError as err:
        raise _io_error(f"open the data dir {directory}", err) from None
    try:
        try:
            fd = open_regular(LOCK_FILE, os.O_RDONLY | os.O_CREAT, 0o750, dir_fd)
        except OSError as err:
            raise _io_error(f"open the lock file {directory}/{LOCK_FILE}", err) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield Store(dir_fd, directory)
        finally:
            os.close(fd)  # closing the last descriptor releases the flock
    finally:
        os.close(dir_fd)


class Store:
    """The reservations of one network; use through open_store() so the lock is held."""

    def __init__(self, dir_fd: int, directory: str) -> None:
        self.fd = dir_fd
        self.dir = directory

    def reserve(self, cid: str, ifname: str, ip: IPAddress, range_id: str) -> bool:
        """Create the file for `ip`; False if someone holds it already."""
        name = str(ip)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o644, dir_fd=self.fd)
        except FileExistsError:
            return False
        except OSError as err:
            raise _io_error(f"reserve {ip}", err) from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_key(cid, ifname))
        except OSError as err:
            self._unlink(name)
            raise _io_error(f"reserve {ip}", err) from None
        try:
            self._overwrite(LAST_IP_PREFIX + range_id, name.encode())
        except OSError as err:
            raise _io_error("record the last reserved IP", err) from None
        return True

    def last_reserved(self, range_id: str) -> IPAddress | None:
        """The last address reserved from range set `range_id`, if recorded and valid."""
        try:
            data = read_regular(LAST_IP_PREFIX + range_id, MAX_FILE, self.fd)
        except OSError:
            return None
        return parse_ip(data.decode(errors="replace"))

    def get_by_id(self, cid: str, ifname: str) -> list[IPAddress]:
        """Addresses held by this container+ifname (or, in old files, by the container)."""
        keys = (_key(cid, ifname), cid.strip().encode())
        return [ip for ip, data in self._leases() if data in keys]

    def find_by_id(self, cid: str, ifname: str) -> bool:
        """True if this container+ifname (or an old file of the container) holds an address."""
        keys = (_key(cid, ifname), cid.strip().encode())
        return any(data in keys for _, data in self._leases())

    def release(self, cid: str, ifname: str) -> None:
        """Drop the container+ifname's files; if none, the container's old-format files."""
        for key in (_key(cid, ifname), cid.strip().encode()):
            matches = [str(ip) for ip, data in self._leases() if data == key]
            removed = [name for name in matches if self._unlink(name)]
            if removed:
                return

    def gc(self, valid: Collection[tuple[str, str]]) -> None:
        """Release every reservation whose (containerID, ifname) is not in `valid`."""
        ids = {cid for cid, _ in valid}
        for ip, data in self._leases():
            cid, sep, ifname = data.decode(errors="replace").partition(LINE_BREAK)
            keep = (cid, ifname) in valid if sep else cid in ids
            if not keep:
                self._unlink(str(ip))

    def _leases(self) -> list[tuple[IPAddress, bytes]]:
        """(address, stripped content) of the leases in this network's own dir, by name."""
        return [(ip, data) for _, ip, data in _leases_in(self.fd)]

    def _overwrite(self, name: str, data: bytes) -> None:
        """Make the file hold `data`, rewriting it in place: O_TRUNC would free and
        reallocate its block, which costs ~0.1 ms on ext4. Readers hold the store's lock."""
        fd = open_regular(name, os.O_WRONLY | os.O_CREAT, 0o666, self.fd)  # as open("wb")
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)

    def _unlink(self, name: str) -> bool:
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError:
            return False
        return True


def leases(data_dir: str = "") -> list[tuple[str, str, str, str]]:
    """(network, IP, containerID, ifname) of every reservation under `data_dir`: the
    leases of <data_dir>/<network>/<ip>, exactly two levels, read without the networks'
    locks: a view for reports, not for decisions."""
    try:
        root = os.open(
            callscope.current().on_host(data_dir or DEFAULT_DATA_DIR),
            os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
        )
    except OSError:
        return []
    found = []
    try:
        for network in _names(root, dirs=True):
            try:
                fd = os.open(network, _DIR, dir_fd=root)
            except OSError:
                continue
            try:
                for _, ip, data in _leases_in(fd):
                    cid, _, ifname = data.decode(errors="replace").partition(LINE_BREAK)
                    found.append((network, str(ip), cid, ifname))
            finally:
                os.close(fd)
    finally:
        os.close(root)
    return found


def _names(dir_fd: int, dirs: bool) -> list[str]:
    """The sorted names of the directories (`dirs`) or regular files in the directory,
    symlinks not followed; none if it cannot be listed."""
    try:
        with os.scandir(dir_fd) as entries:
            return sorted(
                e.name
                for e in entries
                if (e.is_dir(follow_symlinks=False) if dirs else e.is_file(follow_symlinks=False))
            )
    except OSError:
        return []


def _leases_in(dir_fd: int) -> Iterator[tuple[str, IPAddress, bytes]]:
    """(name, address, stripped content) of each lease: a regular file named as an
    address, of at most MAX_FILE bytes; others are not opened, unreadable ones skipped."""
    for name in _names(dir_fd, dirs=False):
        ip = parse_ip(name)
        if ip is None:
            continue
        try:
            data = read_regular(name, MAX_FILE, dir_fd)
        except OSError:
            continue
        yield name, ip, data.strip()


def _key(cid: str, ifname: str) -> bytes:
    return (cid.strip() + LINE_BREAK + ifname).encode()
