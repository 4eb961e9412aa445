"""The CNI_* environment: parsing it on the plugin side, building it on the runtime side."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cni.errors import CNIError, ErrorCode
from cni.fileio import name_problem

COMMANDS = ("ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION")
ENV_VARS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")
"""Every variable a runtime sets; an executor must not let a stale one leak to a plugin."""

_REQUIRED: dict[str, tuple[str, ...]] = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),
    "STATUS": ("CNI_PATH",),
    "GC": ("CNI_PATH",),
    "VERSION": (),
}
_CONTAINER_ID = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", re.ASCII)
_MAX_IFNAME = 15
_RESERVED_IFNAMES = frozenset({".", "..", "all", "default"})
"""Names the kernel refuses for a link: "all" and "default" are the sysctl tree's own
entries (/proc/sys/net/*/conf/all, .../default), whatever the link's kind (EINVAL)."""


@dataclass(frozen=True)
class CmdArgs:
    """One plugin invocation: the parsed environment plus the config bytes from stdin."""

    command: str
    container_id: str
    netns: str
    ifname: str
    args: tuple[tuple[str, str], ...]
    path: tuple[str, ...]
    stdin: bytes

    def arg(self, key: str) -> str | None:
        """The value of `key` in CNI_ARGS (the last one if repeated), or None."""
        found = None
        for k, v in self.args:
            if k == key:
                found = v
        return found


def parse_cni_args(value: str) -> tuple[tuple[str, str], ...]:
    """Split "K=V;K=V" into pairs; CNIError(INVALID_ENV) for an element without a key."""
    pairs = []
    for item in value.split(";"):
        if not item:
            continue
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise CNIError(
                ErrorCode.INVALID_ENV,
                f"invalid CNI_ARGS element {item!r}",
                "expected KEY=VALUE pairs separated by ';'",
            )
        pairs.append((key, val))
    return tuple(pairs)


def format_cni_args(pairs: Iterable[tuple[str, str]]) -> str:
    """Join pairs into the CNI_ARGS form "K=V;K=V"."""
    return ";".join(f"{k}={v}" for k, v in pairs)


def validate_container_id(cid: str) -> None:
    """Reject container IDs the spec does not allow (CNIError(INVALID_ENV))."""
    if not _CONTAINER_ID.fullmatch(cid):
        raise CNIError(
            ErrorCode.INVALID_ENV,
            f"invalid CNI_CONTAINERID {cid!r}",
            "must match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$",
        )
    if problem := name_problem(cid):
        raise CNIError(
            ErrorCode.INVALID_ENV,
            f"invalid CNI_CONTAINERID {cid!r}: {problem}",
            "a container ID names the files kept for it (attachment record, lock)",
        )


def ifname_problem(name: str) -> str | None:
    """Why Linux would refuse `name` as an interface name, or None."""
    if not name:
        return "interface name is empty"
    if len(name.encode()) > _MAX_IFNAME:
        return f'interface name "{name}" is longer than {_MAX_IFNAME} bytes'
    if name in _RESERVED_IFNAMES:
        return f'interface name "{name}" is not allowed (the kernel reserves it)'
    if any(c in "/:" or c.isspace() for c in name):
        return f'interface name "{name}" must not contain "/", ":" or whitespace'
    return None


def validate_ifname(name: str) -> None:
    """Reject interface names Linux would refuse (CNIError(INVALID_ENV))."""
    problem = ifname_problem(name)
    if problem:
        raise CNIError(ErrorCode.INVALID_ENV, f"invalid CNI_IFNAME: {problem}")


def cmd_args_from_env(environ: Mapping[str, str], stdin: bytes) -> CmdArgs:
    """Parse and validate the CNI_* variables the spec requires for CNI_COMMAND."""
    command = environ.get("CNI_COMMAND", "")
    if not command:
        raise CNIError(ErrorCode.INVALID_ENV, "required environment variable CNI_COMMAND is unset")
    if command not in _REQUIRED:
        raise CNIError(
            ErrorCode.INVALID_ENV,
            f"unknown CNI_COMMAND {command!r}",
            f"expected one of {', '.join(COMMANDS)}",
        )
    for var in _REQUIRED[command]:
        if not environ.get(var):
            raise CNIError(
                ErrorCode.INVALID_ENV,
                f"required environment variable {var} is unset",
                f"the {command} command needs {', '.join(_REQUIRED[command])}",
            )
    args = CmdArgs(
        command=command,
        container_id=environ.get("CNI_CONTAINERID", ""),
        netns=environ.get("CNI_NETNS", ""),
        ifname=environ.get("CNI_IFNAME", ""),
        args=parse_cni_args(environ.get("CNI_ARGS", "")),
        path=tuple(p for p in environ.get("CNI_PATH", "").split(os.pathsep) if p),
        stdin=stdin,
    )
    if command in ("ADD", "DEL", "CHECK"):
        validate_container_id(args.container_id)
        validate_ifname(args.ifname)
    return args


def cni_env(
    command: str,
    container_id: str,
    netns: str,
    ifname: str,
    args: Iterable[tuple[str, str]],
    path: Sequence[str],
) -> dict[str, str]:
    """The CNI_* variables a runtime sets to exec a plugin; empty values are left out."""
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": netns,
        "CNI_IFNAME": ifname,
        "CNI_ARGS": format_cni_args(args),
        "CNI_PATH": os.pathsep.join(path),
    }
    return {k: v for k, v in env.items() if v}
