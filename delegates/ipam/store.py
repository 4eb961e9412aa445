"""host-local's on-disk store, byte-compatible with the reference plugin.

Layout under `<dataDir>/<network>/` (dataDir defaults to /var/lib/cni/networks):

- `<ip>`: one file per reserved address, holding "<containerID>\\r\\n<ifname>" (files
  written by old versions hold only the container ID; they still match that container);
- `last_reserved_ip.<range set index>`: the last address reserved from that range set;
- `lock`: flock()ed exclusively around every read-modify-write, as the reference does
  (go-filemutex), so this store and the reference binary can share one directory.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Collection, Iterator
from contextlib import contextmanager

from cni import callscope
from cni.errors import CNIError, ErrorCode
from delegates.ipam.common import IPAddress, parse_ip

DEFAULT_DATA_DIR = "/var/lib/cni/networks"
LINE_BREAK = "\r\n"
LAST_IP_PREFIX = "last_reserved_ip."
LOCK_FILE = "lock"


def _io_error(what: str, err: OSError) -> CNIError:
    return CNIError(ErrorCode.IO_FAILURE, f"host-local: cannot {what}", str(err))


def _on_host(data_dir: str) -> str:
    """The data dir as this call sees it: under the host's / (the call scope's root, a
    daemon's chrootDir), where the exec'd host-local of other plugins keeps it too."""
    return callscope.current().root + (data_dir or DEFAULT_DATA_DIR)


@contextmanager
def open_store(network: str, data_dir: str = "") -> Iterator[Store]:
    """Create the network dir if needed and hold its lock while the block runs."""
    directory = os.path.join(_on_host(data_dir), network)
    try:
        os.makedirs(directory, 0o755, exist_ok=True)
        fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDONLY | os.O_CREAT, 0o750)
    except OSError as err:
        raise _io_error(f"open the data dir {directory}", err) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield Store(directory)
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


class Store:
    """The reservations of one network; use through open_store() so the lock is held."""

    def __init__(self, directory: str) -> None:
        self.dir = directory

    def reserve(self, cid: str, ifname: str, ip: IPAddress, range_id: str) -> bool:
        """Create the file for `ip`; False if someone holds it already."""
        path = os.path.join(self.dir, str(ip))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError as err:
            raise _io_error(f"reserve {ip}", err) from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_key(cid, ifname))
        except OSError as err:
            _unlink(path)
            raise _io_error(f"reserve {ip}", err) from None
        try:
            _overwrite(os.path.join(self.dir, LAST_IP_PREFIX + range_id), str(ip).encode())
        except OSError as err:
            raise _io_error("record the last reserved IP", err) from None
        return True

    def last_reserved(self, range_id: str) -> IPAddress | None:
        """The last address reserved from range set `range_id`, if recorded and valid."""
        try:
            with open(os.path.join(self.dir, LAST_IP_PREFIX + range_id), "rb") as f:
                return parse_ip(f.read().decode(errors="replace"))
        except OSError:
            return None

    def get_by_id(self, cid: str, ifname: str) -> list[IPAddress]:
        """Addresses held by this container+ifname (or, in old files, by the container)."""
        keys = (_key(cid, ifname), cid.strip().encode())
        found = []
        for path, data in self._files():
            ip = parse_ip(os.path.basename(path))
            if data in keys and ip is not None:
                found.append(ip)
        return found

    def find_by_id(self, cid: str, ifname: str) -> bool:
        """True if this container+ifname (or an old file of the container) holds an address."""
        keys = (_key(cid, ifname), cid.strip().encode())
        return any(data in keys for _, data in self._files())

    def release(self, cid: str, ifname: str) -> None:
        """Drop the container+ifname's files; if none, the container's old-format files."""
        for key in (_key(cid, ifname), cid.strip().encode()):
            matches = [path for path, data in self._files() if data == key]
            removed = [path for path in matches if _unlink(path)]
            if removed:
                return

    def gc(self, valid: Collection[tuple[str, str]]) -> None:
        """Release every reservation whose (containerID, ifname) is not in `valid`."""
        ids = {cid for cid, _ in valid}
        for path, data in self._files():
            if parse_ip(os.path.basename(path)) is None:
                continue
            cid, sep, ifname = data.decode(errors="replace").partition(LINE_BREAK)
            keep = (cid, ifname) in valid if sep else cid in ids
            if not keep:
                _unlink(path)

    def _files(self) -> Iterator[tuple[str, bytes]]:
        """(path, stripped content) of every file under the dir, in lexical walk order."""
        return _walk(self.dir)


def leases(data_dir: str = "") -> list[tuple[str, str, str, str]]:
    """(network, IP, containerID, ifname) of every reservation under `data_dir`, read
    without the networks' locks: a view for reports, not for decisions."""
    root = _on_host(data_dir)
    found = []
    for path, data in _walk(root):
        ip = os.path.basename(path)
        if parse_ip(ip) is None:
            continue
        cid, _, ifname = data.decode(errors="replace").partition(LINE_BREAK)
        found.append((os.path.relpath(os.path.dirname(path), root), ip, cid, ifname))
    return found


def _walk(directory: str) -> Iterator[tuple[str, bytes]]:
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                yield from _walk(path)
                continue
            with open(path, "rb") as f:
                data = f.read().strip()
        except OSError:
            continue
        yield path, data


def _overwrite(path: str, data: bytes) -> None:
    """Make the file hold `data`, rewriting it in place: O_TRUNC would free and reallocate
    its block, which costs ~0.1 ms on ext4. Readers hold the store's lock."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)  # as open("wb")
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _key(cid: str, ifname: str) -> bytes:
    return (cid.strip() + LINE_BREAK + ifname).encode()


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except OSError:
        return False
    return True
