"""CHECK: ask each recorded delegate whether its attachment is still as it made it."""

from __future__ import annotations

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.version import version_at_least
from meta.engine.core import Core, aggregate, call_log, labelled


def check(core: Core, args: CmdArgs) -> None:
    log = call_log("check", args)
    with core.node.lock(args.container_id):
        record = core.node.records.load(args.container_id)
        if record is None:
            raise CNIError(
                ErrorCode.UNKNOWN_CONTAINER,
                f"CHECK: no attachment record for container {args.container_id}",
            )
        errors = []
        for delegate in record.delegates:
            net = delegate.network_config()
            if not version_at_least(net.cni_version, "0.4.0"):
                log.info(
                    "delegate check skipped: cniVersion below 0.4.0",
                    network=delegate.network,
                    ifname=delegate.ifname,
                )
                continue
            try:
                with log.step("delegate check", **delegate.log_fields):
                    core.runtime.check(net, core.runtime_conf(args, delegate))
            except CNIError as exc:
                errors.append((delegate, exc))
        if errors:
            raise aggregate("CHECK", labelled(errors))
