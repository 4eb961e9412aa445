"""The lifecycle macvlan and ipvlan share: a link stacked on a master, moved into a pod.

ADD creates the link on the master's side straight into the pod namespace
(IFLA_NET_NS_FD), already named CNI_IFNAME and up, gets the IP config (IPAM, or a
chained prevResult), then on one thread inside the pod looks the link up, sets
arp_notify/ndisc_notify and applies addresses and routes. A failure after the link
exists deletes it and releases IPAM, so nothing is left behind. One netlink socket is
opened where the master lives and one inside the pod.

CHECK and DEL follow the reference plugins (1.1.1); their messages are kept, and every
plugin error of our own has the reference's code 999. Deliberately (the differences
docs/migrating-from-multus.md lists): DEL never looks at the master, so it succeeds once
the master is gone; a missing netns is code 3; in-process IPAM errors carry spec codes; a
name already taken in the pod fails at the create, not at a rename.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from cni import jsonio
from cni.env import CmdArgs
from cni.errors import CNIError
from cni.result import DNS, Interface, Result
from cni.skel import STDIN
from cni.threads import ReusedThreads
from delegates import ipconfig
from delegates.link import (
    create_child,
    default_route_link,
    delete_link,
    describe,
    fail,
    find_link,
    link_index,
    netlink,
    netns_fd,
)
from delegates.netns import NetnsGone, run_in_netns
from delegates.rtnl import Rtnl

if TYPE_CHECKING:  # the standalone plugins start without importing it
    from cni.invoke import Executor

T = TypeVar("T")
log = logging.getLogger("plexus.delegates")

IN_PROCESS_IPAM = frozenset({"host-local", "static"})
"""IPAMs that run in this process without waiting on anything (delegates.ipam.dispatch)."""
_beside = ReusedThreads("ipam-beside", keep_idle=8)


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return f"number {json.dumps(value)}"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def go_field(obj: Mapping[str, Any], key: str, want: type, go_type: str, where: str = "") -> Any:
    """obj[key] as Go's encoding/json decodes it into a field of type `go_type`."""
    value = obj.get(key)
    if value is None:
        return want()
    if isinstance(value, want) and not (want is int and isinstance(value, bool)):
        return value
    raise fail(
        f"failed to load netconf: json: cannot unmarshal {_json_kind(value)} into Go struct "
        f"field {where or 'NetConf'}.{key} of type {go_type}"
    )


def decode_conf(stdin: bytes) -> dict[str, Any]:
    """The plugin config (skel has already checked that it is a JSON object)."""
    raw = jsonio.loads(stdin, STDIN)
    if not isinstance(raw, dict):
        raise fail("failed to load netconf: the config is not a JSON object")
    return raw


def parse_prev_result(raw: Mapping[str, Any]) -> Result | None:
    """`prevResult`, read in the config's cniVersion (as libcni), or None."""
    prev = raw.get("prevResult")
    if prev is None:
        return None
    if not isinstance(prev, Mapping):
        raise fail("could not parse prevResult: it is not a JSON object")
    try:
        return Result.from_dict({"cniVersion": raw.get("cniVersion", ""), **prev})
    except CNIError as exc:
        raise fail(f"could not parse prevResult: {exc}") from None


@dataclass
class LinkConf:
    """The fields macvlan and ipvlan read from their config."""

    raw: dict[str, Any]
    master: str = ""
    mode_name: str = ""
    mode: int = 0  # IFLA_MACVLAN_MODE / IFLA_IPVLAN_MODE, as the kernel numbers it
    mtu: int = 0
    mac: str = ""
    bcqueuelen: int = 0  # macvlan's broadcast queue length; 0 = the kernel's default
    link_in_container: bool = False
    ipam_type: str = ""
    dns: DNS = field(default_factory=DNS)
    prev: Result | None = None


def common_fields(raw: dict[str, Any]) -> LinkConf:
    """Decode the fields both kinds have, with Go's type errors."""
    ipam = go_field(raw, "ipam", dict, "types.IPAM")
    try:
        dns = DNS.model_validate(go_field(raw, "dns", dict, "types.DNS"))
    except ValueError as exc:
        raise fail("failed to load netconf: invalid dns", str(exc)) from None
    return LinkConf(
        raw=raw,
        master=go_field(raw, "master", str, "string"),
        mode_name=go_field(raw, "mode", str, "string"),
        mtu=go_field(raw, "mtu", int, "int"),
        link_in_container=go_field(raw, "linkInContainer", bool, "bool"),
        ipam_type=go_field(ipam, "type", str, "string", "IPAM"),
        dns=dns,
    )


class SubLinkPlugin:
    """ADD/CHECK/DEL/STATUS/GC for a link on a master; subclasses give the kind's config.

    `ipam_exec`: IPAM types to exec from CNI_PATH even though they run in-process by
    default (the meta config's `execDelegates`, handed over by delegates.builtin), with
    `ipam_executor` (the meta-plugin's, e.g. chrooted; default: a plain exec).
    """

    kind = ""
    mode_label = ""  # how CHECK's mode mismatch message names the kind
    check_master_mtu = True  # macvlan 1.1.1 checks mtu <= master's; ipvlan leaves it to the kernel
    modes: ClassVar[dict[str, int]] = {}  # config name -> kernel mode number

    def __init__(
        self, ipam_exec: Iterable[str] = (), ipam_executor: Executor | None = None
    ) -> None:
        self.ipam_exec = frozenset(ipam_exec)
        self.ipam_executor = ipam_executor

    def load(self, args: CmdArgs, command: str) -> LinkConf:
        raise NotImplementedError

    def mode_name(self, kernel_mode: int | None) -> str:
        """The config's name for a kernel mode number (the number itself if unknown)."""
        return next((k for k, v in self.modes.items() if v == kernel_mode), str(kernel_mode))

    def ip_config(self, conf: LinkConf, args: CmdArgs) -> Result | None:
        """The IP config to apply: the IPAM result, or None for an L2-only link."""
        if not conf.ipam_type:
            return None
        from delegates.ipam.dispatch import ipam_add

        result = ipam_add(conf.raw, args, exec_types=self.ipam_exec, executor=self.ipam_executor)
        if not result.ips:
            self._release(conf, args)
            raise fail("IPAM plugin returned missing IP config")
        return result

    def _release(self, conf: LinkConf, args: CmdArgs) -> None:
        """Best-effort IPAM DEL after a failed ADD."""
        from delegates.ipam.dispatch import ipam_del

        _quietly(
            lambda: ipam_del(conf.raw, args, exec_types=self.ipam_exec, executor=self.ipam_executor)
        )

    # -- master side -----------------------------------------------------------------

    def on_master_side(self, conf: LinkConf, args: CmdArgs, fn: Callable[[Rtnl], T]) -> T:
        """fn(nl) with a netlink socket in the namespace where the master lives."""
        if conf.link_in_container:
            return run_in_netns(args.netns, lambda: _with_netlink(fn))
        return _with_netlink(fn)

    def master(self, nl: Rtnl, conf: LinkConf) -> int:
        """The master's index (default: the default route's link), after macvlan's MTU
        check, the one thing that needs more of the master than its index."""
        name = conf.master or default_route_link(nl)
        if self.check_master_mtu and conf.mtu:
            master = find_link(nl, name)
            if master is not None and (conf.mtu < 0 or conf.mtu > master.mtu):
                raise fail(f"invalid MTU {conf.mtu}, must be [0, master MTU({master.mtu})]")
            index = master.index if master is not None else None
        else:
            index = link_index(name)
        if index is None:
            raise fail(f'failed to lookup master "{name}": Link not found')
        return index

    def _create(self, nl: Rtnl, conf: LinkConf, args: CmdArgs) -> None:
        """The link, made in the pod under its final name and up, in one request: the
        kernel checks the name only there, so the reference's temporary name and the
        rename + up after it are not needed."""
        master = self.master(nl, conf)
        into_pod = None if conf.link_in_container else netns_fd(args.netns)
        with into_pod or nullcontext() as fd:
            try:
                create_child(
                    nl,
                    self.kind,
                    args.ifname,
                    master,
                    conf.mode,
                    netns=fd,
                    mtu=conf.mtu,
                    mac=conf.mac,
                    bcqueuelen=conf.bcqueuelen,
                    up=True,
                )
            except Exception as exc:
                raise fail(
                    f'failed to create {self.kind} "{args.ifname}": {describe(exc)}'
                ) from None

    # -- ADD -------------------------------------------------------------------------

    def add(self, args: CmdArgs) -> Result:
        conf = self.load(args, "ADD")
        beside = self._ipam_beside(conf, args)
        try:
            self.on_master_side(conf, args, lambda nl: self._create(nl, conf, args))
        except BaseException:
            if beside is not None:
                _quietly(lambda: self._undo_beside(beside, conf, args))
            raise
        try:
            ipc = beside.result() if beside is not None else self.ip_config(conf, args)
        except BaseException:
            _quietly(lambda: _in_pod(args, lambda nl: delete_link(nl, args.ifname)))
            raise
        try:
            iface = run_in_netns(args.netns, lambda: self._configure(args, ipc))
        except BaseException:
            if conf.ipam_type:
                self._release(conf, args)
            raise
        return ipconfig.attached_result(iface, conf.dns, ipc)

    def _ipam_beside(self, conf: LinkConf, args: CmdArgs) -> Future[Result | None] | None:
        """The IPAM's ADD started on another thread while the link is made, when the
        executor serves the IPAM in process and it waits on an API server (the daemon's
        whereabouts: its write overlaps the link's creation); None for the others (an
        exec'd IPAM, or host-local and static, which take less than a thread handoff)."""
        kind, executor = conf.ipam_type, self.ipam_executor
        if not kind or executor is None or kind in IN_PROCESS_IPAM or kind in self.ipam_exec:
            return None
        if not executor.hosts(kind):
            return None
        outcome: Future[Result | None] = Future()
        context = contextvars.copy_context()  # the call's scope and in-process marks

        def run() -> None:
            try:
                outcome.set_result(context.run(self.ip_config, conf, args))
            except BaseException as exc:  # handed to the caller, which raises it
                outcome.set_exception(exc)

        _beside.run(run)
        return outcome

    def _undo_beside(self, beside: Future[Result | None], conf: LinkConf, args: CmdArgs) -> None:
        """The link failed: release what the IPAM beside it allocated, once it is done."""
        try:
            beside.result()
        except BaseException:
            return  # it allocated nothing (ip_config releases on its own failures)
        self._release(conf, args)

    def _configure(self, args: CmdArgs, ipc: Result | None) -> Interface:
        """Inside the pod: sysctls, addresses, routes; delete the link on failure."""
        with netlink() as nl:
            link = find_link(nl, args.ifname)
            if link is None:
                raise fail(f'{self.kind} "{args.ifname}" is gone from the pod')
            try:
                return ipconfig.configure_pod_iface(nl, link, args.netns, ipc)
            except BaseException:
                _quietly(lambda: delete_link(nl, index=link.index))
                raise

    # -- CHECK -----------------------------------------------------------------------

    def check(self, args: CmdArgs) -> None:
        conf = self.load(args, "CHECK")
        if conf.ipam_type:
            from delegates.ipam.dispatch import ipam_check

            ipam_check(conf.raw, args, exec_types=self.ipam_exec, executor=self.ipam_executor)
        prev = conf.prev
        if prev is None:
            raise fail("Required prevResult missing")
        mine = [i for i in prev.interfaces if i.name == args.ifname and i.sandbox == args.netns]
        sandbox = mine[0].sandbox if mine else ""
        if sandbox != args.netns:
            raise fail(
                f"Sandbox in prevResult {sandbox} doesn't match configured netns: {args.netns}"
            )
        if conf.master:
            self.on_master_side(conf, args, lambda nl: self.master(nl, conf))
        _in_pod(args, lambda nl: self._verify(nl, conf, mine[0], prev, args.ifname))

    def _verify(self, nl: Rtnl, conf: LinkConf, want: Interface, prev: Result, ifname: str) -> None:
        link = find_link(nl, want.name)
        if link is None:
            raise fail(f"Container Interface name in prevResult: {want.name} not found")
        if link.kind != self.kind:
            raise fail(f"Error: Container interface {link.name} not of type {self.kind}")
        have, expected = self.mode_name(link.mode), self.mode_name(conf.mode)
        if have != expected:
            raise fail(
                f"Container {self.mode_label} mode {have} does not match expected value: {expected}"
            )
        if want.mac and want.mac != link.mac:
            raise fail(
                f"Interface {want.name} Mac {want.mac} doesn't match container Mac: {link.mac}"
            )
        ipconfig.verify_ips(nl, link, prev.ips)
        ipconfig.verify_routes(nl, prev, ifname)

    # -- DEL, STATUS, GC -------------------------------------------------------------

    def delete(self, args: CmdArgs) -> None:
        """Release IPAM, then delete the link; a missing namespace or link is success."""
        raw = decode_conf(args.stdin)
        ipam = go_field(raw, "ipam", dict, "types.IPAM")
        if go_field(ipam, "type", str, "string", "IPAM"):
            from delegates.ipam.dispatch import ipam_del

            ipam_del(raw, args, exec_types=self.ipam_exec, executor=self.ipam_executor)
        if not args.netns:
            return
        try:
            _in_pod(args, lambda nl: delete_link(nl, args.ifname))
        except NetnsGone:
            return

    def status(self, args: CmdArgs) -> None:
        """Ready whenever the plugin can run (the reference 1.1.1 has no STATUS), and its
        IPAM, if served in process, is ready (delegates.ipam.dispatch.ipam_status)."""
        raw = decode_conf(args.stdin)
        if go_field(go_field(raw, "ipam", dict, "types.IPAM"), "type", str, "string", "IPAM"):
            from delegates.ipam.dispatch import ipam_status

            ipam_status(raw, args, exec_types=self.ipam_exec, executor=self.ipam_executor)

    def gc(self, args: CmdArgs) -> None:
        """Pass GC to IPAM; links need none (they go away with their namespaces)."""
        raw = decode_conf(args.stdin)
        if go_field(go_field(raw, "ipam", dict, "types.IPAM"), "type", str, "string", "IPAM"):
            from delegates.ipam.dispatch import ipam_gc

            ipam_gc(raw, args, exec_types=self.ipam_exec, executor=self.ipam_executor)


def _with_netlink(fn: Callable[[Rtnl], T]) -> T:
    with netlink() as nl:
        return fn(nl)


def _in_pod(args: CmdArgs, fn: Callable[[Rtnl], T]) -> T:
    return run_in_netns(args.netns, lambda: _with_netlink(fn))


def _quietly(fn: Callable[[], object]) -> None:
    """Best-effort cleanup: log a failure, never raise it."""
    try:
        fn()
    except Exception as exc:
        log.warning("cleanup after a failed ADD failed: %s", exc)
