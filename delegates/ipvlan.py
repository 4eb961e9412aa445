"""The ipvlan CNI plugin (`type: ipvlan`), compatible with the reference plugin 1.1.1.

Config: `master`, `mode` (l2/l3/l3s), `mtu` (not checked against the master's MTU, as in
1.1.1: the kernel accepts it), `linkInContainer` and `ipam`. Without a `master` the
reference uses the default route's interface, or, when chained (a `prevResult` is
present), the single named interface of that result. An ipvlan link needs addresses:
`ipam` is required unless `prevResult` carries IPs, which are then applied to the new
link. The lifecycle is delegates.sublink's.
"""

from __future__ import annotations

import sys

from cni import skel
from cni.env import CmdArgs
from cni.result import Result
from delegates.link import fail
from delegates.rtnl import IPVLAN_MODES
from delegates.sublink import LinkConf, SubLinkPlugin, common_fields, decode_conf, parse_prev_result

# IPVLAN_MODE_* (IFLA_IPVLAN_MODE) as pyroute2 numbers them; it lacks L3S, which follows L3
# in if_link.h's enum
MODES = {
    "l2": IPVLAN_MODES["IPVLAN_MODE_L2"],
    "l3": IPVLAN_MODES["IPVLAN_MODE_L3"],
    "l3s": IPVLAN_MODES["IPVLAN_MODE_L3"] + 1,
}
DEFAULT_MODE = "l2"


class IPvlanPlugin(SubLinkPlugin):
    """`type: ipvlan`; implements cni.skel.Plugin."""

    kind = "ipvlan"
    mode_label = "IPVlan"
    modes = MODES
    check_master_mtu = False  # as 1.1.1: the kernel accepts an ipvlan MTU above the master's

    def load(self, args: CmdArgs, command: str) -> LinkConf:
        raw = decode_conf(args.stdin)
        conf = common_fields(raw)
        conf.prev = parse_prev_result(raw)
        if command == "ADD" and not conf.master and conf.prev is not None:
            named = [i.name for i in conf.prev.interfaces]
            if len(named) != 1 or not named[0]:
                raise fail("chained master failure. PrevResult lacks a single named interface")
            conf.master = named[0]
        mode = MODES.get(conf.mode_name or DEFAULT_MODE)
        if mode is None:
            raise fail(f'unknown ipvlan mode: "{conf.mode_name}"')
        conf.mode = mode
        if command == "ADD" and not conf.ipam_type and not (conf.prev and conf.prev.ips):
            raise fail(
                "ipvlan needs IP addresses: set an IPAM plugin in 'ipam.type'",
                "without 'ipam' the addresses must come from a prevResult with IPs",
            )
        return conf

    def ip_config(self, conf: LinkConf, args: CmdArgs) -> Result | None:
        if not conf.ipam_type and conf.prev is not None and conf.prev.ips:
            return conf.prev
        return super().ip_config(conf, args)


def main() -> None:
    """The `plexus-ipvlan` binary."""
    sys.exit(skel.run(IPvlanPlugin()))
