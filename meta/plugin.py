"""The meta-plugin as a CNI plugin: parse our config, build the engine, run the verb."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from cni import callscope, logs
from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.invoke import ExecExecutor, Executor, find_plugin, seen_from
from cni.logs import StepLogger
from cni.result import Result
from cni.runtime import CNIRuntime
from cni.skel import Plugin
from meta.authority import call_config
from meta.config import DEFAULT_WRITE_BACKLOG, MetaConfig, load_meta_config
from meta.devices import DeviceSource
from meta.engine import Engine
from meta.install import SHIM_NAME
from meta.locks import ContainerLocks
from meta.node import Node
from meta.podresources.client import PodResourcesClient
from meta.policy import refuse_plexus
from meta.sources.base import ClusterSource

ENGINES_KEPT = 8


def source_for(
    conf: MetaConfig,
    node_name: str = "",
    daemon: bool = False,
    backlog: int = DEFAULT_WRITE_BACKLOG,
) -> ClusterSource | None:
    """The cluster source a config names: the embedded store, the API server, or none.

    The daemon keeps informer caches and a background writer of `backlog` writes, and
    may use the in-cluster service account; thin mode reads the API server directly,
    only with an explicit kubeconfig.
    """
    if conf.cluster_dir:
        from meta.sources.store import EmbeddedStore

        return EmbeddedStore(conf.cluster_dir)
    if conf.kubeconfig or (daemon and os.environ.get("KUBERNETES_SERVICE_HOST")):
        from kube.api import KubeAPI
        from meta.sources.kube import KubeSource

        return KubeSource(
            KubeAPI(conf.kubeconfig),
            node_name,
            informers=daemon,
            write_timeout=conf.api_write_timeout,
            backlog=backlog,
        )
    return None


class MetaPlugin:
    """`type: plexus`; implements cni.skel.Plugin.

    `source` lets a long-running host share one cluster source across calls;
    otherwise each call builds the one its config names. Likewise `devices` (where
    pods' device IDs come from); by default the kubelet at the config's paths. `ready`
    (the daemon's): until it is true, STATUS fails, so the runtime reports the node's
    network not ready (containerd 2.x polls STATUS). `authority` (the daemon's): the
    config that decides every key a runtime does not supply (meta/authority.py); without
    it (thin mode, exec'd by the runtime itself) the call's stdin is the config.
    """

    def __init__(
        self,
        source: ClusterSource | None = None,
        executor: Executor | None = None,
        configure_logging: bool = True,
        devices: DeviceSource | None = None,
        ready: Callable[[], bool] | None = None,
        authority: Callable[[], MetaConfig] | None = None,
        cluster_ipam: Plugin | None = None,
    ) -> None:
        self.ready = ready
        self.cluster_ipam = cluster_ipam  # the daemon's in-process whereabouts (docs/ipam.md)
        self.authority = authority
        self.source = source
        self.executor = executor
        self.configure_logging = configure_logging
        self.devices = devices
        self.locks = ContainerLocks()  # shared by every call this plugin serves
        self._engines: dict[tuple[bytes, tuple[str, ...]], tuple[Engine, MetaConfig | None]] = {}
        self._engines_lock = threading.Lock()

    def engine(self, args: CmdArgs) -> Engine:
        """The engine for the call's config and CNI_PATH. A daemon's runtime sends the same
        config on every call, so engines are kept (the last ENGINES_KEPT): parsing the
        config and building the engine took ~0.25 ms of each call."""
        authority = self.authority() if self.authority is not None else None
        key = (args.stdin, args.path)
        with self._engines_lock:
            kept = self._engines.get(key)
        if kept is not None and kept[1] is authority:
            self._bound(kept[0].conf, kept[0].runtime.paths)
            return kept[0]
        if authority is None:
            conf = load_meta_config(args.stdin)
        else:
            conf = call_config(authority, args.stdin)
        if self.configure_logging:
            logs.configure(conf.log_level, conf.log_file, conf.log_to_stderr)
        engine = self.engine_for(conf, args.path)
        with self._engines_lock:
            if len(self._engines) >= ENGINES_KEPT:
                del self._engines[next(iter(self._engines))]
            self._engines[key] = (engine, authority)
        return engine

    def engine_for(self, conf: MetaConfig, cni_path: Sequence[str]) -> Engine:
        """The engine for `conf`, finding plugins in bin_dir then `cni_path`."""
        source = self.source if self.source is not None else source_for(conf)
        paths = ([conf.bin_dir] if conf.bin_dir else []) + list(cni_path)
        self._bound(conf, paths)
        executor = self.executor
        if executor is None:
            from delegates.builtin import BuiltinExecutor

            executor = BuiltinExecutor(
                exec_types=set(conf.exec_delegates),
                fallback=ExecExecutor(chroot_dir=conf.chroot_dir, guard=refuse_plexus),
                cluster_ipam=self.cluster_ipam,
            )
        runtime = CNIRuntime(paths, conf.cni_dir, executor)
        devices = self.devices
        if devices is None:
            devices = PodResourcesClient(conf.pod_resources_socket, conf.device_checkpoint_file)
        return Engine(conf, source, runtime, Node(conf, self.locks), devices)

    @staticmethod
    def _bound(conf: MetaConfig, paths: Sequence[str]) -> None:
        """Set the call's exec bounds from `conf`: timeout, wrapper (looked up on every
        call, so a shim installed or removed since counts), chroot."""
        scope = callscope.current()
        scope.timeout = conf.delegate_timeout
        scope.wrapper = _installed_shim(paths, conf.chroot_dir)
        scope.root = conf.chroot_dir.rstrip("/")

    def add(self, args: CmdArgs) -> Result:
        with _call("add", args):
            return self.engine(args).add(args)

    def delete(self, args: CmdArgs) -> None:
        with _call("del", args):
            self.engine(args).delete(args)

    def check(self, args: CmdArgs) -> None:
        with _call("check", args):
            self.engine(args).check(args)

    def status(self, args: CmdArgs) -> None:
        with _call("status", args):
            if self.ready is not None and not self.ready():
                raise CNIError(
                    ErrorCode.TRY_AGAIN_LATER,
                    "plexus daemon not ready yet",
                    "its Kubernetes informers have not synced",
                )
            self.engine(args).status(args)

    def gc(self, args: CmdArgs) -> None:
        with _call("gc", args):
            self.engine(args).gc(args)


def _installed_shim(paths: Sequence[str], root: str) -> str:
    """The shim among the plugins (looked up from `root`, where delegates are exec'd, and
    named as seen from here: it chroots them), which execs delegates so they die with us;
    "" if none."""
    try:
        shim = find_plugin(SHIM_NAME, paths, root)
    except CNIError:
        return ""
    return seen_from(root, shim) if root else shim


@contextmanager
def _call(verb: str, args: CmdArgs) -> Iterator[None]:
    """One call: its cni.callscope (exec timeouts, cancellation) and its summary line."""
    with callscope.call_scope(), _summary(verb, args):
        yield


@contextmanager
def _summary(verb: str, args: CmdArgs) -> Iterator[None]:
    """One line per call when it ends: its identity, total ms, and the outcome (with the
    CNI error code and message when it failed), whatever step it failed in."""
    log = StepLogger("call", verb=verb, **logs.call_fields(args.container_id, dict(args.args)))
    with log.step(f"cni {verb}", netns=args.netns, ifname=args.ifname):
        yield
