"""IPAM plugins run as binaries, as the reference plugins' ipam.ExecAdd/ExecDel/ExecCheck do.

The IPAM named by conf["ipam"]["type"] is looked up in args.path and run with the plugin's
whole config as stdin and the caller's CNI_* variables, with CNI_COMMAND set to the verb.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cni.env import CmdArgs, cni_env
from cni.errors import CNIError, ErrorCode
from cni.invoke import ExecExecutor, Executor
from cni.result import Result


def run_ipam(
    command: str,
    plugin: str,
    conf: Mapping[str, Any],
    args: CmdArgs,
    executor: Executor | None = None,
) -> bytes:
    """Run IPAM binary `plugin` for `command`; its stdout, or the CNIError it reported."""
    env = cni_env(command, args.container_id, args.netns, args.ifname, args.args, args.path)
    stdin = json.dumps(conf).encode()
    return (executor or ExecExecutor()).run(plugin, stdin, env)


def exec_add(
    plugin: str,
    conf: Mapping[str, Any],
    args: CmdArgs,
    version: str,
    executor: Executor | None = None,
) -> Result:
    """ADD through the binary; the result is converted to `version` if it used another."""
    out = run_ipam("ADD", plugin, conf, args, executor)
    try:
        data = json.loads(out)
    except ValueError as err:
        raise CNIError(
            ErrorCode.DECODE_FAILURE, f"IPAM plugin {plugin!r} printed an invalid result", str(err)
        ) from None
    if not isinstance(data, dict):
        raise CNIError(
            ErrorCode.DECODE_FAILURE, f"IPAM plugin {plugin!r} result is not a JSON object"
        )
    result = Result.from_dict(data)
    return result if result.cni_version == version else result.convert(version)
