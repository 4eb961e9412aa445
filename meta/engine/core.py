"""The engine's seams, and the lookups every verb makes through them.

The engine does no I/O of its own; it touches the world only through its seams: the
cluster source (pods, NADs, network-status, events, and DRA ResourceClaims), the CNI
runtime (delegates and their result cache), the device source (kubelet PodResources) and
the node (attachment records, locks, readiness, device-info files, default routes in the
pod's namespace).
"""

from __future__ import annotations

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.logs import StepLogger, call_fields
from cni.runtime import CNIRuntime, RuntimeConf
from meta.attachments import NetworkNotFound, Resolver
from meta.config import MetaConfig
from meta.delegate import Delegate
from meta.devices import DeviceSource
from meta.node import Node
from meta.policy import refuse_plexus_delegates
from meta.records import AttachmentRecord
from meta.sources.base import ClusterSource, Pod


class Core:
    """One meta config's seams: the pod's networks are resolved and run through them."""

    def __init__(
        self,
        conf: MetaConfig,
        source: ClusterSource | None,
        runtime: CNIRuntime,
        node: Node,
        devices: DeviceSource | None = None,
    ) -> None:
        self.conf = conf
        self.source = source
        self.runtime = runtime
        self.node = node
        self.devices = devices
        self.claims = source.claims() if source is not None else None

    def runtime_conf(self, args: CmdArgs, delegate: Delegate) -> RuntimeConf:
        return RuntimeConf(
            args.container_id,
            args.netns,
            delegate.ifname,
            delegate.runtime_args(args.args),
            delegate.capability_args,
        )

    def pod_expected(self, args: CmdArgs) -> bool:
        return self.source is not None and bool(args.arg("K8S_POD_NAME"))

    def find_pod(self, args: CmdArgs, log: StepLogger, wait: bool = True) -> Pod | None:
        namespace, name = args.arg("K8S_POD_NAMESPACE") or "", args.arg("K8S_POD_NAME") or ""
        if self.source is None or not name:
            return None
        with log.step("get pod"):
            pod = self.source.get_pod(namespace or "default", name, wait)
        uid = args.arg("K8S_POD_UID") or ""
        if pod is not None and uid and pod.uid and uid != pod.uid and not pod.static:
            raise CNIError(
                ErrorCode.UNKNOWN_CONTAINER,
                f"pod {namespace}/{name}: the runtime's K8S_POD_UID {uid} is not the UID of the "
                f"pod now stored ({pod.uid}); this sandbox belongs to an older pod of that name",
            )
        return pod

    def resolve(
        self,
        args: CmdArgs,
        pod: Pod | None,
        log: StepLogger,
        events: bool = True,
        devices: DeviceSource | None = None,
    ) -> list[Delegate]:
        """The pod's delegates; device IDs are looked up only when `devices` is given (ADD)."""
        try:
            with log.step("resolve networks") as fields:
                resolver = Resolver(self.conf, self.source, args.ifname, devices)
                delegates = resolver.resolve(pod)
                fields["networks"] = [f"{d.network}@{d.ifname}" for d in delegates]
                refuse_plexus_delegates(
                    [d.config for d in delegates], list(self.runtime.paths), self.conf.chroot_dir
                )
                return delegates
        except NetworkNotFound as exc:
            if events and pod is not None and self.source is not None:
                self.source.record_event(pod, "Warning", "NoNetworkFound", str(exc))
            raise

    def static_networks(self) -> list[Delegate]:
        """The networks every pod gets: the default one, then the config's other defaults."""
        resolver = Resolver(self.conf, self.source, "eth0")
        if self.conf.delegates:
            return resolver.resolve(None)
        cluster = resolver.resolve(None)[:1]
        return cluster + [
            resolver.named_delegate(ref, i + 1) for i, ref in enumerate(self.conf.default_networks)
        ]

    def load_record(self, container_id: str, log: StepLogger) -> AttachmentRecord | None:
        """The container's record; None, with a warning, if it is unreadable (a crash cut
        it short): DEL and GC then fall back as they do when it is missing."""
        try:
            return self.node.records.load(container_id)
        except CNIError as exc:
            self.warn_unreadable(container_id, exc, log)
            return None

    def warn_unreadable(self, container_id: str, exc: CNIError, log: StepLogger) -> None:
        log.warning(
            "unreadable attachment record: treating it as lost",
            file=str(self.node.records.path(container_id)),
            error=exc.details,
        )


def call_log(verb: str, args: CmdArgs) -> StepLogger:
    return StepLogger("engine", verb=verb, **call_fields(args.container_id, dict(args.args)))


def labelled(errors: list[tuple[Delegate, CNIError]]) -> list[tuple[str, CNIError]]:
    return [(d.label, e) for d, e in errors]


def aggregate(verb: str, errors: list[tuple[str, CNIError]]) -> CNIError:
    """One error for a verb that failed on some networks: the first one's code, all messages."""
    messages = [f"{label}: {e}" for label, e in errors]
    return CNIError(
        errors[0][1].code, f"{verb} failed for {len(errors)} network(s)", "; ".join(messages)
    )
