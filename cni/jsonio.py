"""Decoding untrusted JSON (stdin, annotations, NAD configs, conf files), bounded.

Python's decoder recurses once per nesting level, so a document nested thousands of
levels deep raises RecursionError, and one nested just under the interpreter's limit
breaks whatever recurses over it later (deepcopy, json.dumps, validation). Every
untrusted document goes through `loads`, which bounds size and depth and reports a CNI
decode error (code 6) naming the document.
"""

from __future__ import annotations

import json
from typing import Any

from cni.errors import CNIError, ErrorCode

MAX_BYTES = 8 << 20
"""As the shim's stdin limit; annotations and NADs are far smaller in Kubernetes."""
MAX_DEPTH = 64
"""Nesting levels; real CNI configs use fewer than ten."""


def loads(data: bytes | str, what: str, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON value in `data`; CNIError(DECODE_FAILURE) naming `what` when it is not
    JSON, longer than `max_bytes` or nested deeper than MAX_DEPTH."""
    if len(data) > max_bytes:
        raise CNIError(
            ErrorCode.DECODE_FAILURE,
            f"{what} is too large: {len(data)} bytes, at most {max_bytes} are accepted",
        )
    try:
        value = json.loads(data)
    except RecursionError:
        raise _too_deep(what) from None
    except json.JSONDecodeError as exc:
        raise CNIError(
            ErrorCode.DECODE_FAILURE,
            f"{what}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}",
        ) from None
    except ValueError as exc:  # bytes that are not UTF-8, -16 or -32
        raise CNIError(ErrorCode.DECODE_FAILURE, f"{what}: invalid JSON", str(exc)) from None
    # No document with fewer opening brackets can nest deeper: most skip the walk.
    if _openers(data) > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise _too_deep(what)
    return value


def _openers(data: bytes | str) -> int:
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")


def _deeper_than(value: Any, limit: int) -> bool:
    """True if containers nest more than `limit` levels; walks one level at a time, so
    the cost is one step per container and nothing recurses."""
    level: list[Any] = [value] if isinstance(value, dict | list) else []
    for _ in range(limit):
        below: list[Any] = []
        for container in level:
            items = container.values() if isinstance(container, dict) else container
            below += [item for item in items if isinstance(item, dict | list)]
        if not below:
            return False
        level = below
    return True


def _too_deep(what: str) -> CNIError:
    return CNIError(ErrorCode.DECODE_FAILURE, f"{what} is nested deeper than {MAX_DEPTH} levels")
