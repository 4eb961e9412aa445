"""CNI error values: the `{cniVersion, code, msg, details}` object plugins print on failure."""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Any


class ErrorCode(IntEnum):
    """Well-known error codes from the CNI spec (100+ are plugin-defined)."""

    INCOMPATIBLE_VERSION = 1
    UNSUPPORTED_FIELD = 2
    UNKNOWN_CONTAINER = 3
    INVALID_ENV = 4
    IO_FAILURE = 5
    DECODE_FAILURE = 6
    INVALID_CONFIG = 7
    TRY_AGAIN_LATER = 11
    NOT_AVAILABLE = 50
    LIMITED_CONNECTIVITY = 51


class CNIError(Exception):
    """A CNI failure carrying its wire code, a message and optional details."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(code, msg, details)
        self.code = int(code)
        self.msg = msg
        self.details = details

    def __str__(self) -> str:
        return f"{self.msg}: {self.details}" if self.details else self.msg

    def __repr__(self) -> str:
        return f"CNIError(code={self.code}, msg={self.msg!r}, details={self.details!r})"

    def to_dict(self, cni_version: str) -> dict[str, Any]:
        """The error object as printed on a plugin's stdout."""
        out: dict[str, Any] = {"cniVersion": cni_version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CNIError:
        """Parse a plugin's error object; raises CNIError(DECODE_FAILURE) if it is not one."""
        code = data.get("code")
        msg = data.get("msg", "")
        details = data.get("details", "")
        if isinstance(code, bool) or not isinstance(code, int) or code < 0:
            raise CNIError(ErrorCode.DECODE_FAILURE, "CNI error object has no valid 'code'")
        if not isinstance(msg, str) or not isinstance(details, str):
            raise CNIError(ErrorCode.DECODE_FAILURE, "CNI error 'msg'/'details' must be strings")
        return cls(code, msg, details)
