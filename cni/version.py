"""CNI spec versions: parsing, comparison and choosing a config's version."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from cni.errors import CNIError, ErrorCode

SUPPORTED_VERSIONS: tuple[str, ...] = (
    "0.1.0",
    "0.2.0",
    "0.3.0",
    "0.3.1",
    "0.4.0",
    "1.0.0",
    "1.1.0",
)
CURRENT_VERSION = "1.1.0"
STATUS_VERSION = "1.1.0"
"""The first spec version with STATUS and GC."""
DEFAULT_VERSION = "0.1.0"
"""What a config without `cniVersion` means (libcni's rule)."""

_PART = re.compile(r"[0-9]+", re.ASCII)


@functools.lru_cache(maxsize=64)
def parse_version(v: str) -> tuple[int, int, int]:
    """Parse "X[.Y[.Z]]" ("" is 0.1.0, as libcni); CNIError(DECODE_FAILURE) on junk.

    Cached: a handful of distinct strings are parsed many times per call."""
    if v == "":
        return (0, 1, 0)
    parts = v.split(".")
    if len(parts) > 3 or not all(_PART.fullmatch(p) for p in parts):
        raise CNIError(ErrorCode.DECODE_FAILURE, f"invalid CNI version {v!r}", "expected X.Y.Z")
    nums = [int(p) for p in parts] + [0] * (3 - len(parts))
    return (nums[0], nums[1], nums[2])


def version_at_least(v: str, minimum: str) -> bool:
    """True if version `v` is `minimum` or newer."""
    return parse_version(v) >= parse_version(minimum)


def is_supported(v: str, supported: Sequence[str] = SUPPORTED_VERSIONS) -> bool:
    """True if `v` names one of the `supported` versions."""
    parsed = parse_version(v)
    return any(parse_version(s) == parsed for s in supported)


def select_version(conf: Mapping[str, Any], supported: Sequence[str] = SUPPORTED_VERSIONS) -> str:
    """The version to use for a config: the highest supported of `cniVersions` + `cniVersion`.

    A config with neither means 0.1.0. Raises CNIError(INCOMPATIBLE_VERSION) when none of
    the declared versions is supported.
    """
    declared = conf.get("cniVersion", "")
    listed = conf.get("cniVersions", [])
    if not isinstance(declared, str):
        raise CNIError(ErrorCode.INVALID_CONFIG, "'cniVersion' must be a string")
    if not isinstance(listed, list) or not all(isinstance(v, str) for v in listed):
        raise CNIError(ErrorCode.INVALID_CONFIG, "'cniVersions' must be a list of strings")
    wanted: list[str] = [*listed, declared] if declared else list(listed)
    if not wanted:
        wanted = [DEFAULT_VERSION]
    usable = [v for v in wanted if is_supported(v, supported)]
    if not usable:
        raise CNIError(
            ErrorCode.INCOMPATIBLE_VERSION,
            "incompatible CNI versions",
            f"config declares {wanted}, supported versions are {list(supported)}",
        )
    return max(usable, key=parse_version)
