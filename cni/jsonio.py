"""Decoding untrusted JSON (stdin, annotations, NAD configs, conf files), bounded.

Python's decoder recurses once per nesting level, so a document nested thousands of
levels deep raises RecursionError, and one nested just under the interpreter's limit
breaks whatever recurses over it later (deepcopy, json.dumps, validation). Every
untrusted document goes through `loads`, which bounds size and depth and reports a CNI
decode error (code 6) naming the document. That error is a ValueError too, as
`json.loads`'s are, so `loads` drops in wherever `json.loads` was.
"""

from __future__ import annotations

import json
from typing import Any

from cni.errors import CNIError, ErrorCode

MAX_BYTES = 8 << 20
"""As the shim's stdin limit; annotations and NADs are far smaller in Kubernetes."""
MAX_DEPTH = 64
"""Nesting levels; real CNI configs use fewer than ten."""


class DecodeError(CNIError, ValueError):
    """CNIError(DECODE_FAILURE) for a document `loads` refuses."""


def loads(data: bytes | str, what: str, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON value in `data`; DecodeError naming `what` when it is not JSON, longer
    than `max_bytes` or nested deeper than MAX_DEPTH."""
    if len(data) > max_bytes:
        raise DecodeError(
            ErrorCode.DECODE_FAILURE,
            f"{what} is too large: {len(data)} bytes, at most {max_bytes} are accepted",
        )
    try:
        value = json.loads(data)
    except RecursionError:
        raise _too_deep(what) from None
    except json.JSONDecodeError as exc:
        raise DecodeError(
            ErrorCode.DECODE_FAILURE,
            f"{what}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
        ) from None
    except ValueError as exc:  # bytes that are not UTF-8, -16 or -32
        raise DecodeError(ErrorCode.DECODE_FAILURE, f"{what}: invalid JSON", str(exc)) from None
    # A document with fewer opening brackets cannot nest deeper: most skip the scan.
    if _openers(data) > MAX_DEPTH and _deeper_than(data, MAX_DEPTH):
        raise _too_deep(what)
    return value


def _openers(data: bytes | str) -> int:
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")


_BRACKETS_ONLY = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


def _deeper_than(data: bytes | str, limit: int) -> bool:
    """True if valid JSON `data` nests more than `limit` levels.

    With escapes and strings dropped and `{}` made `[]`, what remains is the nesting
    alone, and each pass removes its innermost level (every adjacent `[]`). Only C-level
    bytes operations, so a large document costs about what decoding it did.
    """
    if isinstance(data, bytes) and (encoding := json.detect_encoding(data)) != "utf-8":
        data = data.decode(encoding)  # UTF-16/32, which json accepts: scan it as UTF-8
    raw = data.encode() if isinstance(data, str) else data
    # Escapes occur only inside strings; without them every '"' opens or closes one.
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside_strings = b"".join(unescaped.split(b'"')[::2])
    nesting = outside_strings.translate(_BRACKETS_ONLY, _NOT_BRACKETS)
    for _ in range(limit):
        nesting = nesting.replace(b"[]", b"")
        if not nesting:
            return False
    return True


def _too_deep(what: str) -> DecodeError:
    return DecodeError(ErrorCode.DECODE_FAILURE, f"{what} is nested deeper than {MAX_DEPTH} levels")
