"""The macvlan CNI plugin (`type: macvlan`), compatible with the reference plugin 1.1.1.

Config: `master` (default: the interface of the default route), `mode`
(bridge/private/vepa/passthru, and source), `mtu` (0..master's), `mac` (overridden by
CNI_ARGS `MAC`, then by `runtimeConfig.mac`), `linkInContainer` (the master lives in
the pod namespace, as in later reference versions), `bcqueuelen` (the broadcast queue
length, a uint32 as in later reference versions: set when the link is created, 0 or unset
leaves the kernel's default, not compared by CHECK; the 1.1.1 reference ignores it) and
an optional `ipam` (without it the interface is L2 only: up, no addresses).
The lifecycle is delegates.sublink's.
"""

from __future__ import annotations

import re
import sys

from cni import skel
from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.hwaddr import station_problem
from delegates.link import default_route_link, fail
from delegates.rtnl import MACVLAN_MODE_NAMES
from delegates.sublink import (
    LinkConf,
    SubLinkPlugin,
    common_fields,
    decode_conf,
    go_field,
    parse_prev_result,
)

UINT32_MAX = 0xFFFFFFFF
# MACVLAN_MODE_* by the names pyroute2 gives them (its 0, "none", is no mode)
MODES = {name: number for number, name in MACVLAN_MODE_NAMES.items() if number}
DEFAULT_MODE = "bridge"
_MAC_FORMS = (
    re.compile(r"(?:[0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}"),
    re.compile(r"(?:[0-9a-fA-F]{2}-){5}[0-9a-fA-F]{2}"),
    re.compile(r"(?:[0-9a-fA-F]{4}\.){2}[0-9a-fA-F]{4}"),
)


def parse_mac(text: str) -> str:
    """A 6-byte MAC in one of Go's net.ParseMAC notations, as lower-case xx:xx:.."""
    if not any(form.fullmatch(text) for form in _MAC_FORMS):
        raise fail(f"invalid args {text} for MAC addr: address {text}: invalid MAC address")
    digits = re.sub(r"[^0-9a-fA-F]", "", text).lower()
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))


def mac_from_cni_args(args: CmdArgs) -> str:
    """CNI_ARGS `MAC`; as libcni's LoadArgs, other keys fail unless IgnoreUnknown is true."""
    mac, ignore, unknown = "", False, []
    for key, value in args.args:
        if key == "MAC":
            mac = value
        elif key == "IgnoreUnknown":
            if value.lower() not in ("1", "true", "0", "false"):
                raise fail(
                    f'ARGS: error parsing value of pair "{key}={value}": '
                    f"boolean unmarshal error: invalid input {value}"
                )
            ignore = value.lower() in ("1", "true")
        else:
            unknown.append(f'"{key}={value}"')
    if unknown and not ignore:
        raise fail(f"ARGS: unknown args [{' '.join(unknown)}]")
    return mac


class MacvlanPlugin(SubLinkPlugin):
    """`type: macvlan`; implements cni.skel.Plugin."""

    kind = "macvlan"
    mode_label = "macvlan"
    modes = MODES

    def load(self, args: CmdArgs, command: str) -> LinkConf:
        raw = decode_conf(args.stdin)
        conf = common_fields(raw)
        conf.mac = go_field(raw, "mac", str, "string")
        source = "mac"
        conf.bcqueuelen = go_field(raw, "bcqueuelen", int, "uint32")
        if not 0 <= conf.bcqueuelen <= UINT32_MAX:  # Go refuses it when decoding the uint32
            raise fail(
                f"failed to load netconf: json: cannot unmarshal number {conf.bcqueuelen} "
                "into Go struct field NetConf.bcqueuelen of type uint32"
            )
        if args.args and (mac := mac_from_cni_args(args)):
            conf.mac, source = mac, "CNI_ARGS MAC"
        runtime = go_field(raw, "runtimeConfig", dict, "struct")
        if mac := go_field(runtime, "mac", str, "string", "runtimeConfig"):
            conf.mac, source = mac, "runtimeConfig.mac"
        mode = MODES.get(conf.mode_name or DEFAULT_MODE)
        if mode is None:
            raise fail(f'unknown macvlan mode: "{conf.mode_name}"')
        conf.mode = mode
        if conf.mac:
            conf.mac = parse_mac(conf.mac)
            if command == "ADD" and (problem := station_problem(conf.mac)):
                code = (
                    ErrorCode.INVALID_ENV if source == "CNI_ARGS MAC" else ErrorCode.INVALID_CONFIG
                )
                raise CNIError(code, f"invalid {source}: {problem}")
        if command == "CHECK":
            conf.prev = parse_prev_result(raw)
            if not conf.master:
                conf.master = self.on_master_side(conf, args, default_route_link)
        return conf


def main() -> None:
    """The `plexus-macvlan` binary."""
    sys.exit(skel.run(MacvlanPlugin()))
