"""The shim <-> daemon wire format, version 1.

Request:  b"PXS1" | u32 env length | "KEY=VALUE\\0"... | u32 stdin length | stdin
Response: b"PXS1" | u32 exit code  | u32 stdout length | stdout
Integers are big-endian. The shim sends only CNI_* variables.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Protocol

from cni.errors import CNIError, ErrorCode

MAGIC = b"PXS1"
SOCKET_NAME = "plexus.sock"
MAX_ENV = 64 * 1024
MAX_STDIN = 8 * 1024 * 1024
_U32 = struct.Struct(">I")


class Receiver(Protocol):
    """What requests are read from: a socket, or one under a deadline."""

    def recv(self, size: int, /) -> bytes: ...


@dataclass(frozen=True)
class Request:
    env: dict[str, str]
    stdin: bytes


def _read_exact(sock: Receiver, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise CNIError(ErrorCode.DECODE_FAILURE, "plexus daemon: request truncated")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_length(sock: Receiver, limit: int, what: str) -> int:
    length: int = _U32.unpack(_read_exact(sock, 4))[0]
    if length > limit:
        raise CNIError(
            ErrorCode.DECODE_FAILURE,
            f"plexus daemon: {what} of {length} bytes is over the {limit}-byte limit",
        )
    return length


def read_request(sock: Receiver) -> Request:
    """Decode one request; CNIError(DECODE_FAILURE) names what is wrong with it."""
    magic = _read_exact(sock, 4)
    if magic != MAGIC:
        raise CNIError(
            ErrorCode.DECODE_FAILURE,
            f"plexus daemon: unknown protocol {magic!r}, expected {MAGIC!r}",
        )
    raw_env = _read_exact(sock, _read_length(sock, MAX_ENV, "environment"))
    env: dict[str, str] = {}
    for entry in raw_env.split(b"\0"):
        if not entry:
            continue
        key, sep, value = entry.decode(errors="replace").partition("=")
        if not sep:
            raise CNIError(
                ErrorCode.DECODE_FAILURE, f"plexus daemon: environment entry {key!r} has no '='"
            )
        env[key] = value
    stdin = _read_exact(sock, _read_length(sock, MAX_STDIN, "stdin"))
    return Request(env=env, stdin=stdin)


def encode_request(env: dict[str, str], stdin: bytes) -> bytes:
    """The bytes the shim sends (used by tests and the Python client)."""
    raw_env = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    return MAGIC + _U32.pack(len(raw_env)) + raw_env + _U32.pack(len(stdin)) + stdin


def encode_response(exit_code: int, stdout: bytes) -> bytes:
    return MAGIC + _U32.pack(exit_code) + _U32.pack(len(stdout)) + stdout


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """Decode the daemon's answer: exit code and stdout."""
    head = _read_exact(sock, 12)
    if head[:4] != MAGIC:
        raise CNIError(ErrorCode.DECODE_FAILURE, "plexus daemon: bad response")
    (code,) = _U32.unpack(head[4:8])
    (length,) = _U32.unpack(head[8:12])
    return code, _read_exact(sock, length)
