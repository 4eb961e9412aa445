"""An Executor that runs Plexus's own plugins in-process and execs everything else.

`BuiltinExecutor` hosts the plugin types in HOSTED (macvlan, ipvlan, sriov): for those it
parses the CNI_* environment and stdin exactly as the plugin binary would and calls
cni.skel.dispatch in this process, which saves the fork/exec and interpreter start of
a binary. Types listed in `exec_types`, and any type it does not host, go to the
fallback executor (cni.invoke.ExecExecutor by default), which finds the binary in
CNI_PATH.

`exec_types` covers IPAM types too: every hosted plugin gets the set as `ipam_exec`, and
execs an IPAM listed there (e.g. "host-local") from CNI_PATH instead of running
delegates.ipam.dispatch's in-process one. The set travels with the
plugin instance, so two executors with different settings never interfere.

With `cluster_ipam` (the daemon's delegates.ipam.whereabouts.plugin.ClusterIPAM) the
IPAM type `whereabouts` runs in process too: hosted plugins reach their IPAM through this
executor, which serves it unless `exec_types` lists it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Mapping

from cni.env import cmd_args_from_env
from cni.errors import CNIError
from cni.invoke import ExecExecutor, Executor
from cni.skel import UNEXPECTED_ERROR, Plugin, dispatch

log = logging.getLogger("plexus.delegates")

HOSTED: dict[str, tuple[str, str]] = {
    "macvlan": ("delegates.macvlan", "MacvlanPlugin"),
    "ipvlan": ("delegates.ipvlan", "IPvlanPlugin"),
    "sriov": ("delegates.sriov", "SriovPlugin"),
}
"""Plugin type -> (module, class); modules are imported on first use."""
CLUSTER_IPAM = "whereabouts"
"""The IPAM type `cluster_ipam` serves."""


def hosted_plugin(
    plugin_type: str, exec_types: Iterable[str] = (), ipam_executor: Executor | None = None
) -> Plugin:
    """A fresh instance of the in-process plugin for `plugin_type` (KeyError if none),
    running the IPAM types in `exec_types` as binaries through `ipam_executor`."""
    module, name = HOSTED[plugin_type]
    cls = getattr(importlib.import_module(module), name)
    plugin: Plugin = cls(ipam_exec=frozenset(exec_types), ipam_executor=ipam_executor)
    return plugin


class BuiltinExecutor:
    """cni.invoke.Executor: in-process for hosted types, `fallback` for the rest."""

    def __init__(
        self,
        exec_types: Iterable[str] = (),
        fallback: Executor | None = None,
        cluster_ipam: Plugin | None = None,
    ) -> None:
        self.exec_types = frozenset(exec_types)
        self.fallback: Executor = fallback if fallback is not None else ExecExecutor()
        self.cluster_ipam = cluster_ipam

    def hosts(self, plugin_type: str) -> bool:
        """True if `plugin_type` runs in-process."""
        if plugin_type in self.exec_types:
            return False
        return plugin_type in HOSTED or (
            plugin_type == CLUSTER_IPAM and self.cluster_ipam is not None
        )

    def run(self, plugin_type: str, stdin: bytes, env: Mapping[str, str]) -> bytes:
        """What the plugin would print on success; its CNIError on failure."""
        if not self.hosts(plugin_type):
            return self.fallback.run(plugin_type, stdin, env)
        args = cmd_args_from_env(env, stdin)
        try:
            if plugin_type == CLUSTER_IPAM and self.cluster_ipam is not None:
                return dispatch(self.cluster_ipam, args)
            plugin = hosted_plugin(plugin_type, self.exec_types, self)
            return dispatch(plugin, args)
        except CNIError:
            raise
        except Exception as exc:
            # What skel.run would print for a crash of the standalone binary.
            log.exception("in-process %s %s crashed", plugin_type, args.command)
            raise CNIError(
                UNEXPECTED_ERROR, "unexpected error", str(exc) or type(exc).__name__
            ) from exc
