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

An in-process plugin has the deadline of an exec'd one (the call scope's `timeout`,
delegateTimeoutSeconds): it runs on a reused thread (cni/threads.py) while the caller
waits for it at most that long, then fails the call with code 5. Python cannot kill a
thread, so work that outlives its caller goes on (stuck in a syscall, a lock, a file)
until it ends, and its result is dropped. It holds its attachment's lock (containerID,
ifname) all along, besides its own (host-local's store lock, the VF's lock), and work
starts only while its caller still waits: later calls of that attachment wait for it
(failing with code 5 at their own deadline), none runs beside it or after its caller
gave up, and the DEL that follows undoes whatever it did.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from functools import partial

from cni import callscope
from cni.env import CmdArgs, cmd_args_from_env
from cni.errors import CNIError, ErrorCode
from cni.invoke import ExecExecutor, Executor
from cni.skel import UNEXPECTED_ERROR, Plugin, dispatch
from cni.threads import ReusedThreads
from delegates.netns import here, run_where

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
        """What the plugin would print on success; its CNIError on failure (code 5 once
        the call scope's timeout has passed)."""
        if not self.hosts(plugin_type):
            return self.fallback.run(plugin_type, stdin, env)
        args = cmd_args_from_env(env, stdin)
        if _working.get():  # a plugin's IPAM, called by in-process work: within its bounds
            return self._dispatch(plugin_type, args)
        timeout = callscope.current().timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        outcome = _Outcome()
        context = contextvars.copy_context()  # the call's scope: its root, its execs' bounds
        work = partial(self._settle, outcome, plugin_type, args, deadline)
        where = here()
        _threads.run(lambda: context.run(run_where, where, work))
        if not outcome.done.acquire(timeout=-1 if timeout is None else timeout):
            raise _timed_out(plugin_type, timeout)
        if outcome.error is not None:
            raise outcome.error
        return outcome.value

    def _settle(
        self, outcome: _Outcome, plugin_type: str, args: CmdArgs, deadline: float | None
    ) -> None:
        """Run the plugin into `outcome`, on this thread: under its attachment's lock, and
        only if that is taken before `deadline` (else the caller has stopped waiting)."""
        _working.set(True)
        key = (args.container_id, args.ifname)
        if _attachments.take(key, deadline):
            try:
                outcome.value = self._dispatch(plugin_type, args)
            except BaseException as exc:  # handed to the caller, which raises it
                outcome.error = exc
            finally:
                _attachments.give(key)
        else:  # past the deadline: the caller has stopped waiting, or does now
            outcome.error = _timed_out(plugin_type, callscope.current().timeout)
        outcome.done.release()

    def _dispatch(self, plugin_type: str, args: CmdArgs) -> bytes:
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


def _timed_out(plugin_type: str, timeout: float | None) -> CNIError:
    return CNIError(
        ErrorCode.IO_FAILURE,
        f"plugin {plugin_type} timed out after {timeout:g} s (in-process: it cannot be "
        "killed, and goes on holding its locks)",
        "raise delegateTimeoutSeconds if the plugin is slow but healthy",
    )


class _Outcome:
    """What in-process work returned or raised, once `done` is released."""

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.value = b""
        self.error: BaseException | None = None


class _AttachmentLocks:
    """One lock per attachment (containerID, ifname), held by in-process work while it
    runs; dropped once nobody holds or waits for it. STATUS and GC (no container) take
    none."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], tuple[threading.Lock, int]] = {}

    def take(self, key: tuple[str, str], deadline: float | None) -> bool:
        """Whether the lock of `key` was taken before `deadline` (None: no bound); if it
        was not, nothing is held."""
        if not key[0]:
            return deadline is None or time.monotonic() < deadline
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        left = -1.0 if deadline is None else max(deadline - time.monotonic(), 0.0)
        if lock.acquire(timeout=left):
            if deadline is None or time.monotonic() < deadline:
                return True
            lock.release()
        self._drop(key)
        return False

    def give(self, key: tuple[str, str]) -> None:
        """Release the lock `take` took."""
        if key[0]:
            self._locks[key][0].release()
            self._drop(key)

    def _drop(self, key: tuple[str, str]) -> None:
        with self._guard:
            lock, users = self._locks[key]
            if users > 1:
                self._locks[key] = (lock, users - 1)
            else:
                del self._locks[key]


_threads = ReusedThreads("in-process", keep_idle=16)
_attachments = _AttachmentLocks()
_working = contextvars.ContextVar("in_process_work", default=False)
"""Set in the context of in-process work (nested calls run within its bounds)."""
