"""Plugin side of CNI: turn env + stdin into a verb call and its exact stdout."""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, BinaryIO, Protocol

from cni import jsonio
from cni.env import CmdArgs, cmd_args_from_env
from cni.errors import CNIError, ErrorCode
from cni.result import Result
from cni.version import (
    CURRENT_VERSION,
    STATUS_VERSION,
    SUPPORTED_VERSIONS,
    parse_version,
    select_version,
)

UNEXPECTED_ERROR = 999
"""Code for failures that are not CNIErrors (a bug or an unhandled OS error)."""

# The first spec version that has each verb.
_MIN_VERSION = {"CHECK": "0.4.0", "STATUS": STATUS_VERSION, "GC": STATUS_VERSION}


class Plugin(Protocol):
    """The verbs a CNI plugin implements; each raises CNIError on failure."""

    def add(self, args: CmdArgs) -> Result: ...

    def delete(self, args: CmdArgs) -> None: ...

    def check(self, args: CmdArgs) -> None: ...

    def status(self, args: CmdArgs) -> None: ...

    def gc(self, args: CmdArgs) -> None: ...


def version_output(supported: Sequence[str] = SUPPORTED_VERSIONS) -> bytes:
    """The VERSION reply: the newest supported version and the full list."""
    newest = max(supported, key=parse_version)
    reply = {"cniVersion": newest, "supportedVersions": list(supported)}
    return json.dumps(reply, separators=(",", ":")).encode()


STDIN = "network config on stdin"
"""How errors name the config a plugin reads on stdin."""


def _decode_conf(stdin: bytes) -> dict[str, Any]:
    conf = jsonio.loads(stdin, STDIN)
    if not isinstance(conf, dict):
        raise CNIError(ErrorCode.DECODE_FAILURE, "network config on stdin must be a JSON object")
    if not isinstance(conf.get("name"), str) or not conf["name"]:
        raise CNIError(ErrorCode.INVALID_CONFIG, "network config has no 'name'")
    return conf


def dispatch(plugin: Plugin, args: CmdArgs, supported: Sequence[str] = SUPPORTED_VERSIONS) -> bytes:
    """Validate the config on stdin, call the verb and return exactly the bytes to print.

    ADD prints its result converted to the config's cniVersion; VERSION prints the version
    reply; every other verb prints nothing. Raises CNIError.
    """
    if args.command == "VERSION":
        return version_output(supported)
    version = select_version(_decode_conf(args.stdin), supported)
    minimum = _MIN_VERSION.get(args.command)
    if minimum and parse_version(version) < parse_version(minimum):
        raise CNIError(
            ErrorCode.INCOMPATIBLE_VERSION,
            f"config version {version} does not allow {args.command}",
            f"{args.command} needs cniVersion {minimum} or later",
        )
    if args.command == "ADD":
        return json.dumps(plugin.add(args).to_dict(version), separators=(",", ":")).encode()
    verbs = {
        "DEL": plugin.delete,
        "CHECK": plugin.check,
        "STATUS": plugin.status,
        "GC": plugin.gc,
    }
    verbs[args.command](args)
    return b""


def _error_version(stdin: bytes) -> str:
    """The cniVersion to stamp on an error: the config's if readable, else the newest."""
    try:
        conf = jsonio.loads(stdin, STDIN)
    except CNIError:
        return CURRENT_VERSION
    version = conf.get("cniVersion") if isinstance(conf, dict) else None
    return version if isinstance(version, str) and version else CURRENT_VERSION


def handle(
    plugin: Plugin,
    environ: Mapping[str, str],
    data: bytes,
    supported: Sequence[str] = SUPPORTED_VERSIONS,
) -> tuple[int, bytes]:
    """One call from its environment and stdin: the exit code and the bytes to print.

    Unexpected exceptions become CNIError(999) with the traceback on stderr.
    """
    try:
        return 0, dispatch(plugin, cmd_args_from_env(environ, data), supported)
    except CNIError as err:
        error = err
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        error = CNIError(UNEXPECTED_ERROR, "unexpected error", str(exc) or type(exc).__name__)
    return 1, json.dumps(error.to_dict(_error_version(data))).encode()


def run(
    plugin: Plugin,
    supported: Sequence[str] = SUPPORTED_VERSIONS,
    *,
    environ: Mapping[str, str] | None = None,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
) -> int:
    """A plugin binary's main: print the verb's output or the error JSON; return the exit code."""
    out = stdout if stdout is not None else sys.stdout.buffer
    data = (stdin if stdin is not None else sys.stdin.buffer).read()
    code, reply = handle(plugin, os.environ if environ is None else environ, data, supported)
    out.write(reply)
    out.flush()
    return code
