"""rtnetlink for the delegates: pyroute2's message definitions over a socket Plexus owns.

pyroute2 defines every message: its ifinfmsg, ifaddrmsg and rtmsg classes (SR-IOV VF
attributes included) encode every request (each fixed part and attribute once, its bytes
kept for the next request that sends it: `encode`), and the replies are read with the attribute
numbers and header layouts of the same classes. The socket, the framing, the sequence
numbers and the wait for the kernel's ack are here, on a plain NETLINK_ROUTE socket in
the calling thread: pyroute2's IPRoute runs an asyncio loop per socket (~1 ms to open,
~2.5 ms more per macvlan ADD), and decoding a reply with its classes builds an object per
attribute (~41 in a link reply), which put a macvlan ADD over its 2.5 ms budget; the
reader below looks only at the attributes asked for (docs/performance.md).

Kernel errors are raised as OSError with the errno the kernel returned.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from functools import cache
from typing import Any, ClassVar

from cni.packages import skip_package_init

# pyroute2/__init__.py only re-exports its whole API (IPRoute, NDB, ...): importing it
# costs +24 MiB RSS and ~4x the import time of the message modules used here
# (docs/performance.md), so the package is entered without it.
skip_package_init("pyroute2")
# Every other module takes pyroute2's names from here, so this runs first.
from pyroute2.netlink import (  # noqa: E402
    NLM_F_ACK,
    NLM_F_APPEND,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    nla_header,
    nlmsg,
)
from pyroute2.netlink.rtnl import (  # noqa: E402
    RTM_DELLINK,
    RTM_DELLINKPROP,
    RTM_DELROUTE,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETROUTE,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWROUTE,
    rtprotos,
    rtypes,
)
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_DADFAILED, IFA_F_TENTATIVE, ifaddrmsg  # noqa: E402
from pyroute2.netlink.rtnl.ifinfmsg import IFF_LOWER_UP, IFF_UP, ifinfmsg  # noqa: E402
from pyroute2.netlink.rtnl.rtmsg import nh, rtmsg  # noqa: E402
from pyroute2.protocols import ETH_P_8021AD, ETH_P_8021Q  # noqa: E402

__all__ = [
    "ETH_P_8021AD",
    "ETH_P_8021Q",
    "IFA_F_DADFAILED",
    "IFA_F_TENTATIVE",
    "IFF_LOWER_UP",
    "IFF_UP",
    "IPVLAN_MODES",
    "MACVLAN_MODE_NAMES",
    "NLM_F_APPEND",
    "NLM_F_CREATE",
    "NLM_F_EXCL",
    "NLM_F_REPLACE",
    "RTM_DELLINK",
    "RTM_DELLINKPROP",
    "RTM_DELROUTE",
    "RTM_GETADDR",
    "RTM_GETLINK",
    "RTM_GETROUTE",
    "RTM_NEWADDR",
    "RTM_NEWLINK",
    "RTM_NEWROUTE",
    "AddrMsg",
    "LinkMsg",
    "NextHop",
    "RouteMsg",
    "Rtnl",
    "attr_class",
    "encode",
    "fields_of",
    "get_str",
    "get_u32",
    "header_of",
    "iter_attrs",
    "nested",
    "numbers",
    "parse_attrs",
    "rtprotos",
    "rtypes",
]

HEADER = struct.Struct("=" + "".join(fmt for _, fmt in nlmsg.header))  # len, type, flags, seq, pid
ATTR = struct.Struct("=" + "".join(fmt for _, fmt in nla_header.header))  # len, type
ERROR = struct.Struct("=i")
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
_RECV_SIZE = 65536  # the kernel fills at most 32 KiB per dump part


# -- the message definitions: pyroute2's, two 0.9 attribute tables fixed ---------------


class LinkMsg(ifinfmsg):
    """pyroute2's ifinfmsg with two fixes to its 0.9 attribute tables (below)."""

    # pyroute2 caches a compiled attribute table per class, and a subclass would inherit
    # its parent's: each class below asks for its own.
    _nlmsg_base__compiled_nla = False

    class vflist(ifinfmsg.vflist):
        _nlmsg_base__compiled_nla = False

        class vfinfo(ifinfmsg.vflist.vfinfo):
            _nlmsg_base__compiled_nla = False

            class vf_vlist(ifinfmsg.vflist.vfinfo.vf_vlist):
                _nlmsg_base__compiled_nla = False

                class ivvi(ifinfmsg.vflist.vfinfo.vf_vlist.ivvi):
                    # struct ifla_vf_vlan_info ends with 2 bytes of padding after the
                    # be16 proto; pyroute2 leaves them out and the kernel refuses the
                    # 14-byte attribute (EINVAL) in IFLA_VF_VLAN_LIST.
                    fields = (*ifinfmsg.vflist.vfinfo.vf_vlist.ivvi.fields, ("__pad", "2x"))

    class ifinfo(ifinfmsg.ifinfo):
        _nlmsg_base__compiled_nla = False

        class macvlan_data(ifinfmsg.ifinfo.macvlan_data):
            # if_link.h's next IFLA_MACVLAN_* entry (Linux 5.11+), which pyroute2 0.9
            # lacks; the table is positional, so appending gives it the kernel's number.
            _nlmsg_base__compiled_nla = False
            nla_map = (
                *ifinfmsg.ifinfo.macvlan_data.nla_map,
                ("IFLA_MACVLAN_BC_QUEUE_LEN", "uint32"),
            )

        data_map: ClassVar[dict[str, Any]] = {**ifinfmsg.ifinfo.data_map, "macvlan": macvlan_data}


MACVLAN_MODE_NAMES: dict[int, str] = LinkMsg.ifinfo.macvlan_data.mode.value_map
IPVLAN_MODES: dict[str, int] = {
    name: number
    for name, number in LinkMsg.ifinfo.data_map["ipvlan"].modes.items()
    if isinstance(name, str)
}
AddrMsg = ifaddrmsg
RouteMsg = rtmsg
NextHop = nh


# -- requests: encoded by pyroute2 ----------------------------------------------------


def encode(cls: Any, attrs: list[Any] | None = None, **fields: int) -> bytes:
    """The body (after the netlink header) of a `cls` message with header `fields` (the
    others 0) and `attrs`, [(name, value)] as pyroute2 takes them, encoded by pyroute2.

    pyroute2 builds an object per attribute, nested level and header field on every
    encode (docs/performance.md), and an ADD sends mostly what earlier ones sent (the
    master's index, the pod's interface name, the link kind and mode), so the fixed part
    and each attribute keep the bytes pyroute2 gave them, and only new attributes are
    encoded, together. An attribute's encoding depends on its class, name and value (its
    repr stands for it: str, int, dict and list values) and on the message's `family`
    only (the one header field pyroute2's address attributes read); the attributes follow
    the fixed part back to back, each padded to 4 bytes (tests/unit/delegates/
    test_rtnl_bytes.py holds the result for every request shape).
    """
    head = (cls, tuple(fields.items()))
    fixed = _parts.get(head) or _keep(head, _encode(cls, [], fields))
    if not attrs:
        return fixed
    family = fields.get("family", 0)
    keys = [(cls, family, name, repr(value)) for name, value in attrs]
    # one lookup per key: another thread's _keep may empty the table meanwhile
    parts = {key: _parts.get(key) for key in keys}
    new = {key: attr for key, attr in zip(keys, attrs, strict=True) if parts[key] is None}
    if new:
        chain = _encode_attrs(cls, list(new.values()), family)
        for key, (start, end) in zip(new, _attr_spans(chain), strict=True):
            parts[key] = _keep(key, chain[start:end])
    return fixed + b"".join(parts[key] or b"" for key in keys)


_PARTS_LIMIT = 1024  # parts kept; fresh names and addresses keep coming
_parts: dict[tuple[Any, ...], bytes] = {}


def _keep(key: tuple[Any, ...], part: bytes) -> bytes:
    if len(_parts) >= _PARTS_LIMIT:
        _parts.clear()
    _parts[key] = part
    return part


def _encode(cls: Any, attrs: list[Any], fields: dict[str, int]) -> bytes:
    """pyroute2's encoding of a `cls` message, without the netlink header."""
    return _run(cls(), cls.fields, attrs, fields)


def _encode_attrs(cls: Any, attrs: list[Any], family: int) -> bytes:
    """Only the attributes of such a message (of `family`), without its fixed part.

    Writing the fixed fields is most of what encoding an attribute or two costs: pyroute2
    looks each one up through its attribute accessors. The buffer starts with 4 unused
    bytes, as pyroute2 gives an attribute a buffer of its own (`data or bytearray()`)
    while its message's is still empty."""
    msg = _attrs_only(cls)(data=bytearray(4), offset=4)
    return _run(msg, cls.fields, attrs, {"family": family})[4:]


@cache
def _attrs_only(cls: Any) -> Any:
    """`cls` with no fixed fields to write."""
    return type(cls.__name__, (cls,), {"__slots__": (), "fields": ()})


def _run(msg: Any, header: Any, attrs: list[Any], fields: dict[str, int]) -> bytes:
    msg.header = None  # the netlink header is Rtnl's: sequence numbers are per socket
    for name, _ in header:  # set even when not written: the classes' encode() reads some
        msg[name] = fields.get(name, 0)
    msg["attrs"] = attrs
    msg.encode()
    return bytes(msg.data)


def _attr_spans(data: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of each attribute in `data`, its padding included."""
    offset = 0
    while offset + ATTR.size <= len(data):
        end = offset + ((ATTR.unpack_from(data, offset)[0] + 3) & ~3)
        yield offset, end
        offset = end


def nested(*attrs: tuple[str, Any]) -> dict[str, Any]:
    """The value pyroute2 encodes as a nested attribute holding `attrs`."""
    return {"attrs": list(attrs)}


# -- replies: read with pyroute2's numbers and layouts, only what is asked for ---------


@cache
def _table(cls: Any) -> tuple[dict[str, int], dict[str, str]]:
    numbers, types = {}, {}
    for position, item in enumerate(cls.nla_map):
        number, name, kind = item[:3] if isinstance(item[0], int) else (position, *item[:2])
        numbers[name], types[name] = number, kind.lstrip("*")
    return numbers, types


def numbers(cls: Any) -> dict[str, int]:
    """Attribute name -> number in a pyroute2 class's table (positional or keyed)."""
    return _table(cls)[0]


def attr_class(cls: Any, name: str) -> Any:
    """The pyroute2 class that holds attribute `name` of `cls` (its payload's layout)."""
    return getattr(cls, _table(cls)[1][name])


@cache
def header_of(cls: Any) -> struct.Struct:
    """The fixed part of a pyroute2 class (its cell header, then its `fields`) as a struct."""
    fields = (*(cls.cell_header or ()), *cls.fields)
    return struct.Struct("=" + "".join(fmt for _, fmt in fields))


@cache
def _layout(cls: Any) -> tuple[tuple[str, struct.Struct, int], ...]:
    layout, offset = [], 0
    for name, fmt in cls.fields:
        one = struct.Struct(fmt if fmt[0] in "<>=!@" else "=" + fmt)
        if not fmt.endswith("x"):
            layout.append((name, one, offset))
        offset += one.size
    return tuple(layout)


def fields_of(cls: Any, payload: bytes) -> dict[str, Any]:
    """The fields of a struct attribute (pyroute2 class `cls`, e.g. an ifla_vf_*) by name;
    a repeated format ("32B") reads as a tuple. A payload too short for a field stops."""
    found: dict[str, Any] = {}
    for name, one, offset in _layout(cls):
        if offset + one.size > len(payload):
            break
        value = one.unpack_from(payload, offset)
        found[name] = value[0] if len(value) == 1 else value
    return found


def iter_attrs(data: bytes, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each attribute in data[offset:], in order, repeats included."""
    end = len(data)
    while offset + ATTR.size <= end:
        size, kind = ATTR.unpack_from(data, offset)
        if size < ATTR.size or offset + size > end:
            return
        yield kind & NLA_TYPE_MASK, data[offset + ATTR.size : offset + size]
        offset += (size + 3) & ~3


def parse_attrs(data: bytes, offset: int = 0) -> dict[int, bytes]:
    """Attribute type -> payload for the attributes in data[offset:] (the last one wins)."""
    return dict(iter_attrs(data, offset))


def get_u32(attrs: dict[int, bytes], kind: int) -> int | None:
    value = attrs.get(kind)
    return struct.unpack_from("=I", value)[0] if value is not None and len(value) >= 4 else None


def get_str(attrs: dict[int, bytes], kind: int) -> str:
    return attrs.get(kind, b"").split(b"\0", 1)[0].decode(errors="replace")


# -- the socket -----------------------------------------------------------------------


class Rtnl:
    """A NETLINK_ROUTE socket in the calling thread's network namespace, no multicast."""

    def __init__(self) -> None:
        self._sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
        )
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def request(self, msg_type: int, body: bytes, flags: int = 0) -> list[bytes]:
        """Send one request with NLM_F_ACK; the replies before the ack (header included)."""
        return list(self._exchange(msg_type, body, flags | NLM_F_ACK, dump=False))

    def dump(self, msg_type: int, body: bytes) -> list[bytes]:
        """Send a dump request; every message of the dump (header included)."""
        return list(self._exchange(msg_type, body, NLM_F_DUMP, dump=True))

    def _exchange(self, msg_type: int, body: bytes, flags: int, dump: bool) -> Iterator[bytes]:
        self._seq += 1
        seq = self._seq
        self._sock.send(
            HEADER.pack(HEADER.size + len(body), msg_type, flags | NLM_F_REQUEST, seq, 0) + body
        )
        while True:
            data, _, msg_flags, _ = self._sock.recvmsg(_RECV_SIZE)
            if msg_flags & socket.MSG_TRUNC:
                raise OSError(f"rtnetlink reply larger than {_RECV_SIZE} bytes")
            offset = 0
            while offset + HEADER.size <= len(data):
                size, kind, _, reply_seq, _ = HEADER.unpack_from(data, offset)
                if size < HEADER.size:
                    break
                msg = data[offset : offset + size]
                offset += (size + 3) & ~3
                if reply_seq != seq:
                    continue
                if kind in (NLMSG_ERROR, NLMSG_DONE):
                    code = ERROR.unpack_from(msg, HEADER.size)[0] if size >= HEADER.size + 4 else 0
                    if code:
                        raise OSError(-code, os.strerror(-code))
                    if kind == NLMSG_ERROR or dump:
                        return
                    continue
                yield msg
