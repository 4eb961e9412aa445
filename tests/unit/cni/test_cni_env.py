from __future__ import annotations

import pytest

from cni.env import (
    cmd_args_from_env,
    cni_env,
    format_cni_args,
    parse_cni_args,
    validate_container_id,
    validate_ifname,
)
from cni.errors import CNIError, ErrorCode

FULL_ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "c0ffee",
    "CNI_NETNS": "/var/run/netns/x",
    "CNI_IFNAME": "eth0",
    "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=web-0",
    "CNI_PATH": "/opt/cni/bin:/usr/lib/cni",
}


@pytest.mark.parametrize("cid", ["a", "0", "abc-DEF_1.2", "f" * 64])
def test_valid_container_ids(cid: str) -> None:
    validate_container_id(cid)


@pytest.mark.parametrize("cid", ["", "-abc", ".abc", "_abc", "a b", "a/b", "a:b", "ä"])
def test_invalid_container_ids(cid: str) -> None:
    with pytest.raises(CNIError) as exc:
        validate_container_id(cid)
    assert exc.value.code == ErrorCode.INVALID_ENV
    assert repr(cid) in exc.value.msg


def test_a_container_id_longer_than_a_file_name_is_invalid() -> None:
    """It names files (the attachment record, its lock): refused before any is made."""
    validate_container_id("c" * 255)
    with pytest.raises(CNIError) as exc:
        validate_container_id("c" * 256)
    assert exc.value.code == ErrorCode.INVALID_ENV
    assert exc.value.msg == (
        f"invalid CNI_CONTAINERID {'c' * 256!r}: 256 bytes, more than the 255 a file name may have"
    )


@pytest.mark.parametrize("name", ["eth0", "net1", "a" * 15, "vlan.100", "...", "alle", "lo"])
def test_valid_ifnames(name: str) -> None:
    validate_ifname(name)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "interface name is empty"),
        ("a" * 16, "longer than 15 bytes"),
        ("é" * 8, "longer than 15 bytes"),
        (".", "is not allowed"),
        ("..", "is not allowed"),
        ("all", 'interface name "all" is not allowed (the kernel reserves it)'),
        ("default", 'interface name "default" is not allowed (the kernel reserves it)'),
        ("a/b", 'must not contain "/", ":" or whitespace'),
        ("a:b", 'must not contain "/", ":" or whitespace'),
        ("a b", 'must not contain "/", ":" or whitespace'),
        ("a\tb", 'must not contain "/", ":" or whitespace'),
        ("a\nb", 'must not contain "/", ":" or whitespace'),
    ],
)
def test_invalid_ifnames(name: str, message: str) -> None:
    with pytest.raises(CNIError) as exc:
        validate_ifname(name)
    assert exc.value.code == ErrorCode.INVALID_ENV
    assert exc.value.msg.startswith("invalid CNI_IFNAME") and message in exc.value.msg


def test_parse_cni_args() -> None:
    assert parse_cni_args("") == ()
    assert parse_cni_args("A=1;B=;C=x=y") == (("A", "1"), ("B", ""), ("C", "x=y"))
    assert parse_cni_args("A=1;") == (("A", "1"),)


@pytest.mark.parametrize("value", ["A", "A=1;B", "=1"])
def test_parse_cni_args_rejects_bad_elements(value: str) -> None:
    with pytest.raises(CNIError) as exc:
        parse_cni_args(value)
    assert exc.value.code == ErrorCode.INVALID_ENV


def test_format_cni_args_round_trip() -> None:
    pairs = (("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", "default"))
    assert format_cni_args(pairs) == "IgnoreUnknown=1;K8S_POD_NAMESPACE=default"
    assert parse_cni_args(format_cni_args(pairs)) == pairs


def test_cmd_args_from_env() -> None:
    args = cmd_args_from_env(FULL_ENV, b"{}")
    assert args.command == "ADD"
    assert args.container_id == "c0ffee"
    assert args.netns == "/var/run/netns/x"
    assert args.ifname == "eth0"
    assert args.path == ("/opt/cni/bin", "/usr/lib/cni")
    assert args.stdin == b"{}"
    assert args.arg("K8S_POD_NAME") == "web-0"
    assert args.arg("missing") is None


@pytest.mark.parametrize(
    ("command", "required"),
    [
        ("ADD", ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]),
        ("CHECK", ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]),
        ("DEL", ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"]),
        ("STATUS", ["CNI_PATH"]),
        ("GC", ["CNI_PATH"]),
        ("VERSION", []),
    ],
)
def test_required_vars_per_verb(command: str, required: list[str]) -> None:
    env = {**FULL_ENV, "CNI_COMMAND": command}
    for var in ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"):
        reduced = {k: v for k, v in env.items() if k != var}
        if var in required:
            with pytest.raises(CNIError) as exc:
                cmd_args_from_env(reduced, b"")
            assert exc.value.code == ErrorCode.INVALID_ENV
            assert var in exc.value.msg
        else:
            assert cmd_args_from_env(reduced, b"").command == command


def test_empty_var_counts_as_missing() -> None:
    with pytest.raises(CNIError, match="CNI_NETNS"):
        cmd_args_from_env({**FULL_ENV, "CNI_NETNS": ""}, b"")


def test_del_without_netns() -> None:
    env = {k: v for k, v in FULL_ENV.items() if k != "CNI_NETNS"}
    args = cmd_args_from_env({**env, "CNI_COMMAND": "DEL"}, b"")
    assert args.netns == ""


@pytest.mark.parametrize("command", ["", "add", "FOO"])
def test_unknown_or_missing_command(command: str) -> None:
    with pytest.raises(CNIError) as exc:
        cmd_args_from_env({**FULL_ENV, "CNI_COMMAND": command}, b"")
    assert exc.value.code == ErrorCode.INVALID_ENV
    assert "CNI_COMMAND" in exc.value.msg


def test_invalid_values_are_rejected() -> None:
    with pytest.raises(CNIError, match="CNI_CONTAINERID"):
        cmd_args_from_env({**FULL_ENV, "CNI_CONTAINERID": "-x"}, b"")
    with pytest.raises(CNIError, match="interface name"):
        cmd_args_from_env({**FULL_ENV, "CNI_IFNAME": "eth0:1"}, b"")
    with pytest.raises(CNIError, match="CNI_ARGS"):
        cmd_args_from_env({**FULL_ENV, "CNI_ARGS": "novalue"}, b"")


def test_cni_env() -> None:
    env = cni_env("ADD", "c1", "/proc/1/ns/net", "eth0", [("A", "1"), ("B", "2")], ["/a", "/b"])
    assert env == {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/proc/1/ns/net",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "A=1;B=2",
        "CNI_PATH": "/a:/b",
    }
    assert cni_env("GC", "", "", "", (), ["/a"]) == {"CNI_COMMAND": "GC", "CNI_PATH": "/a"}
    assert cmd_args_from_env(env, b"").args == (("A", "1"), ("B", "2"))
