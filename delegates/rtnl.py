"""A small rtnetlink client: framing, attributes and errors, on a plain NETLINK_ROUTE socket.

Every netlink request Plexus makes (links, addresses, routes, SR-IOV VF attributes) is a
handful of struct calls and one send/recv here; through pyroute2, used before, each cost
~0.3-0.5 ms (an asyncio loop per socket, generic marshalling). delegates.link and
delegates.vf build the messages.

Kernel errors are raised as OSError with the errno the kernel returned.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_APPEND = 0x800
NLM_F_DUMP = 0x300
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER

HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
ATTR = struct.Struct("=HH")  # nlattr: len, type
ERROR = struct.Struct("=i")
_RECV_SIZE = 65536  # the kernel fills at most 32 KiB per dump part


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    size = ATTR.size + len(payload)
    return ATTR.pack(size, kind) + payload + b"\0" * (-size % 4)


def attr_u16(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=H", value))


def attr_u32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=I", value))


def attr_str(kind: int, value: str) -> bytes:
    """A NUL-terminated string attribute (interface names, link kinds)."""
    return attr(kind, value.encode() + b"\0")


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
