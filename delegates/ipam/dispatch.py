"""Run a delegate plugin's IPAM: host-local and static in process, anything else exec'd.

`conf` is the delegate plugin's whole config (with "ipam", "name", "cniVersion",
"runtimeConfig", "args", "prevResult"); `args.stdin` is not used, the IPAM sees `conf`.
ADD returns a Result in the config's cniVersion with no interfaces and no interface index
on its ips (the calling plugin sets it). Each call takes `exec_types`: IPAM types to exec
from args.path instead of running in-process (the meta config's `execDelegates`, passed
down by the plugin, never read from a global). host-local keeps the reference's on-disk
layout and locking, so it can share ranges with the reference binary. Error codes: see
delegates.ipam.common.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.invoke import Executor
from cni.result import Result
from cni.version import STATUS_VERSION
from delegates.ipam import host_local, static
from delegates.ipam.common import before, conf_version
from delegates.ipam.exec import exec_add, run_ipam

__all__ = [
    "IN_PROCESS",
    "ipam_add",
    "ipam_check",
    "ipam_del",
    "ipam_gc",
    "ipam_status",
    "ipam_type",
    "runs_in_process",
]

IN_PROCESS = frozenset({"host-local", "static"})
"""IPAM types run in this process unless listed in a call's `exec_types` (the meta config's
`execDelegates`): those are exec'd from args.path like any other IPAM."""


def ipam_type(conf: Mapping[str, Any]) -> str:
    """conf["ipam"]["type"]; CNIError(INVALID_CONFIG) if missing."""
    ipam = conf.get("ipam")
    if not isinstance(ipam, Mapping):
        raise CNIError(ErrorCode.INVALID_CONFIG, "IPAM config missing 'ipam' key")
    kind = ipam.get("type")
    if not isinstance(kind, str) or not kind:
        raise CNIError(ErrorCode.INVALID_CONFIG, "IPAM config has no 'type'", "field ipam.type")
    return kind


def runs_in_process(kind: str, exec_types: Collection[str] = ()) -> bool:
    """True if IPAM type `kind` runs in this process rather than as a binary."""
    return kind in IN_PROCESS and kind not in exec_types


def ipam_add(
    conf: Mapping[str, Any],
    args: CmdArgs,
    *,
    executor: Executor | None = None,
    exec_types: Collection[str] = (),
) -> Result:
    """Allocate addresses for args.container_id/args.ifname; raises CNIError."""
    kind = ipam_type(conf)
    if not runs_in_process(kind, exec_types):
        return exec_add(kind, conf, args, conf_version(conf), executor)
    if kind == "host-local":
        return host_local.add(conf, args)
    return static.add(conf, args)


def ipam_del(
    conf: Mapping[str, Any],
    args: CmdArgs,
    *,
    executor: Executor | None = None,
    exec_types: Collection[str] = (),
) -> None:
    """Release what ADD allocated; succeeds if there is nothing to release."""
    kind = ipam_type(conf)
    if not runs_in_process(kind, exec_types):
        run_ipam("DEL", kind, conf, args, executor)
    elif kind == "host-local":
        host_local.delete(conf, args)


def ipam_check(
    conf: Mapping[str, Any],
    args: CmdArgs,
    *,
    executor: Executor | None = None,
    exec_types: Collection[str] = (),
) -> None:
    """Verify the allocation still holds (static needs conf["prevResult"]); raises CNIError."""
    kind = ipam_type(conf)
    if not runs_in_process(kind, exec_types):
        run_ipam("CHECK", kind, conf, args, executor)
        return
    if before(conf_version(conf), "0.4.0"):
        raise CNIError(ErrorCode.INCOMPATIBLE_VERSION, "config version does not allow CHECK")
    if kind == "host-local":
        host_local.check(conf, args)
    else:
        static.check(conf, args)


def ipam_status(
    conf: Mapping[str, Any],
    args: CmdArgs,
    *,
    executor: Executor | None = None,
    exec_types: Collection[str] = (),
) -> None:
    """STATUS of an IPAM the executor serves in process (the daemon's whereabouts: can
    its API server be written); host-local and static are always ready, and exec'd IPAMs
    are not asked (the reference plugins 1.1.1 have no STATUS)."""
    kind = ipam_type(conf)
    if runs_in_process(kind, exec_types) or executor is None or not executor.hosts(kind):
        return
    if not before(conf_version(conf), STATUS_VERSION):
        run_ipam("STATUS", kind, conf, args, executor)


def ipam_gc(
    conf: Mapping[str, Any],
    args: CmdArgs,
    *,
    executor: Executor | None = None,
    exec_types: Collection[str] = (),
) -> None:
    """Release allocations not listed in conf["cni.dev/valid-attachments"].

    host-local does it in process, static has nothing to do, and exec'd IPAMs get GC only
    when the config is 1.1.0 or newer (older plugins do not know the verb).
    """
    kind = ipam_type(conf)
    if runs_in_process(kind, exec_types):
        if kind == "host-local":
            host_local.gc(conf, args)
    elif not before(conf_version(conf), STATUS_VERSION):
        run_ipam("GC", kind, conf, args, executor)
