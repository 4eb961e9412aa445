"""The meta-plugin as a CNI plugin: parse our config, build the engine, run the verb."""

from __future__ import annotations

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.invoke import Executor
from cni.result import Result
from cni.runtime import CNIRuntime
from meta import logs
from meta.config import MetaConfig, load_meta_config
from meta.engine import Engine
from meta.records import RecordStore
from meta.sources.base import ClusterSource


def source_for(conf: MetaConfig) -> ClusterSource | None:
    """The cluster source a config names: the embedded store, or none."""
    if conf.cluster_dir:
        from meta.sources.store import EmbeddedStore

        return EmbeddedStore(conf.cluster_dir)
    if conf.kubeconfig:
        raise CNIError(
            ErrorCode.NOT_AVAILABLE,
            "kubeconfig is set but the Kubernetes source runs only in the node daemon",
            "start `plexus daemon`, or use clusterDir for an embedded store",
        )
    return None


class MetaPlugin:
    """`type: plexus`; implements cni.skel.Plugin.

    `source` lets a long-running host share one cluster source across calls;
    otherwise each call builds the one its config names.
    """

    def __init__(
        self,
        source: ClusterSource | None = None,
        executor: Executor | None = None,
        configure_logging: bool = True,
    ) -> None:
        self.source = source
        self.executor = executor
        self.configure_logging = configure_logging

    def engine(self, args: CmdArgs) -> Engine:
        conf = load_meta_config(args.stdin)
        if self.configure_logging:
            logs.configure(conf.log_level, conf.log_file, conf.log_to_stderr)
        source = self.source if self.source is not None else source_for(conf)
        paths = ([conf.bin_dir] if conf.bin_dir else []) + list(args.path)
        runtime = CNIRuntime(paths, conf.cni_dir, self.executor)
        return Engine(conf, source, runtime, RecordStore(conf.cni_dir))

    def add(self, args: CmdArgs) -> Result:
        return self.engine(args).add(args)

    def delete(self, args: CmdArgs) -> None:
        self.engine(args).delete(args)

    def check(self, args: CmdArgs) -> None:
        self.engine(args).check(args)

    def status(self, args: CmdArgs) -> None:
        self.engine(args).status(args)

    def gc(self, args: CmdArgs) -> None:
        self.engine(args).gc(args)
