from __future__ import annotations

from typing import Any

import pytest

from cni.errors import CNIError, ErrorCode
from cni.version import (
    SUPPORTED_VERSIONS,
    parse_version,
    select_version,
    version_at_least,
)


def test_parse_version() -> None:
    assert parse_version("0.3.1") == (0, 3, 1)
    assert parse_version("1.0") == (1, 0, 0)
    assert parse_version("1") == (1, 0, 0)
    assert parse_version("") == (0, 1, 0)


@pytest.mark.parametrize("junk", ["abc", "1.x.0", "1.0.0.0", "-1.0.0", "1..0", " 1.0.0", "v1.0.0"])
def test_parse_version_rejects_junk(junk: str) -> None:
    with pytest.raises(CNIError) as exc:
        parse_version(junk)
    assert exc.value.code == ErrorCode.DECODE_FAILURE
    assert junk in exc.value.msg


def test_version_at_least() -> None:
    assert version_at_least("0.4.0", "0.4.0")
    assert version_at_least("1.0.0", "0.4.0")
    assert not version_at_least("0.3.1", "0.4.0")
    assert version_at_least("0.10.0", "0.9.0")


@pytest.mark.parametrize(
    ("conf", "supported", "expected"),
    [
        ({"cniVersion": "0.3.1"}, SUPPORTED_VERSIONS, "0.3.1"),
        ({}, SUPPORTED_VERSIONS, "0.1.0"),
        ({"cniVersion": ""}, SUPPORTED_VERSIONS, "0.1.0"),
        ({"cniVersions": ["0.4.0", "1.0.0"]}, SUPPORTED_VERSIONS, "1.0.0"),
        ({"cniVersions": ["1.0.0", "1.1.0", "9.0.0"]}, SUPPORTED_VERSIONS, "1.1.0"),
        ({"cniVersion": "1.0.0", "cniVersions": ["0.4.0"]}, SUPPORTED_VERSIONS, "1.0.0"),
        ({"cniVersion": "0.4.0", "cniVersions": ["1.0.0"]}, SUPPORTED_VERSIONS, "1.0.0"),
        ({"cniVersion": "1.1.0", "cniVersions": ["1.0.0", "1.1.0"]}, ("0.4.0", "1.0.0"), "1.0.0"),
        ({"cniVersion": "9.9.9", "cniVersions": ["0.3.1"]}, SUPPORTED_VERSIONS, "0.3.1"),
    ],
)
def test_select_version(conf: dict[str, Any], supported: tuple[str, ...], expected: str) -> None:
    assert select_version(conf, supported) == expected


@pytest.mark.parametrize(
    ("conf", "supported"),
    [
        ({"cniVersion": "2.0.0"}, SUPPORTED_VERSIONS),
        ({"cniVersion": "1.1.0"}, ("0.4.0", "1.0.0")),
        ({"cniVersions": ["1.1.0"]}, ("1.0.0",)),
        ({}, ("1.0.0",)),
    ],
)
def test_select_version_none_supported(conf: dict[str, Any], supported: tuple[str, ...]) -> None:
    with pytest.raises(CNIError) as exc:
        select_version(conf, supported)
    assert exc.value.code == ErrorCode.INCOMPATIBLE_VERSION
    assert str(list(supported)) in exc.value.details


@pytest.mark.parametrize(
    "conf", [{"cniVersion": 1}, {"cniVersions": "1.0.0"}, {"cniVersions": [1]}]
)
def test_select_version_bad_types(conf: dict[str, Any]) -> None:
    with pytest.raises(CNIError) as exc:
        select_version(conf)
    assert exc.value.code == ErrorCode.INVALID_CONFIG


def test_select_version_junk_entry() -> None:
    with pytest.raises(CNIError) as exc:
        select_version({"cniVersions": ["one"]})
    assert exc.value.code == ErrorCode.DECODE_FAILURE
