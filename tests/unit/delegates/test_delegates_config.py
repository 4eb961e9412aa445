"""macvlan/ipvlan config validation: the reference's messages and code (999), no kernel."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cni.env import CmdArgs
from cni.errors import CNIError
from cni.skel import dispatch
from delegates.ipvlan import IPvlanPlugin
from delegates.link import PLUGIN_ERROR
from delegates.macvlan import MacvlanPlugin, mac_from_cni_args, parse_mac
from delegates.sublink import go_field

# A namespace path that cannot exist: a config error must be raised before it is used.
NO_NETNS = "/nonexistent/plexus-unit-netns"


def _args(conf: dict[str, Any], command: str = "ADD", cni_args: str = "") -> CmdArgs:
    pairs = tuple(tuple(p.split("=", 1)) for p in cni_args.split(";") if p)
    return CmdArgs(
        command=command,
        container_id="cid",
        netns=NO_NETNS,
        ifname="eth0",
        args=pairs,  # type: ignore[arg-type]
        path=("/usr/lib/cni",),
        stdin=json.dumps(conf).encode(),
    )


def _macvlan(**extra: Any) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "master": "up0", **extra}


def _ipvlan(**extra: Any) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "n", "type": "ipvlan", "master": "up0", **extra}


def _error(plugin: Any, conf: dict[str, Any], command: str = "ADD", cni_args: str = "") -> CNIError:
    with pytest.raises(CNIError) as info:
        dispatch(plugin, _args(conf, command, cni_args))
    return info.value


# -- macvlan -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["foo", "l2", "Bridge"])
def test_macvlan_unknown_mode(mode: str) -> None:
    err = _error(MacvlanPlugin(), _macvlan(mode=mode))
    assert (err.code, err.msg) == (PLUGIN_ERROR, f'unknown macvlan mode: "{mode}"')


@pytest.mark.parametrize(
    ("mode", "value"),
    [("", 4), ("bridge", 4), ("private", 1), ("vepa", 2), ("passthru", 8), ("source", 16)],
)
def test_macvlan_known_modes(mode: str, value: int) -> None:
    plugin = MacvlanPlugin()
    conf = plugin.load(_args(_macvlan(mode=mode)), "ADD")
    assert conf.mode == value
    assert plugin.mode_name(value) == (mode or "bridge")


@pytest.mark.parametrize(
    ("value", "kind"),
    [("1500", "string"), (1.5, "number 1.5"), (True, "bool"), ([1], "array"), ({}, "object")],
)
def test_macvlan_mtu_type(value: Any, kind: str) -> None:
    err = _error(MacvlanPlugin(), _macvlan(mtu=value))
    assert err.code == PLUGIN_ERROR
    assert err.msg == (
        f"failed to load netconf: json: cannot unmarshal {kind} into Go struct field "
        "NetConf.mtu of type int"
    )


def test_macvlan_null_fields_mean_zero_values() -> None:
    conf = MacvlanPlugin().load(
        _args(_macvlan(mtu=None, mode=None, mac=None, bcqueuelen=None)), "ADD"
    )
    assert (conf.mtu, conf.mode, conf.mac, conf.bcqueuelen) == (0, 4, "", 0)


@pytest.mark.parametrize("value", [0, 1, 2000, 0xFFFFFFFF])
def test_macvlan_bcqueuelen_is_a_uint32(value: int) -> None:
    assert MacvlanPlugin().load(_args(_macvlan(bcqueuelen=value)), "ADD").bcqueuelen == value
    assert MacvlanPlugin().load(_args(_macvlan()), "ADD").bcqueuelen == 0


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (-1, "number -1"),
        (0x100000000, "number 4294967296"),
        (1.5, "number 1.5"),
        ("1000", "string"),
        (True, "bool"),
    ],
)
def test_macvlan_bad_bcqueuelen(value: Any, kind: str) -> None:
    """As upstream's `BcQueueLen uint32`: Go's decoder refuses it (negative ones too)."""
    err = _error(MacvlanPlugin(), _macvlan(bcqueuelen=value))
    assert (err.code, err.msg) == (
        PLUGIN_ERROR,
        f"failed to load netconf: json: cannot unmarshal {kind} into Go struct field "
        "NetConf.bcqueuelen of type uint32",
    )


def test_ipvlan_has_no_bcqueuelen() -> None:
    conf = _ipvlan(bcqueuelen=-1, ipam={"type": "static"})
    assert IPvlanPlugin().load(_args(conf), "ADD").bcqueuelen == 0


@pytest.mark.parametrize("where", ["config", "runtimeConfig", "CNI_ARGS"])
def test_macvlan_bad_mac(where: str) -> None:
    bad = "zz:00:00:00:00:01"
    conf, cni_args = _macvlan(), ""
    if where == "config":
        conf["mac"] = bad
    elif where == "runtimeConfig":
        conf["runtimeConfig"] = {"mac": bad}
    else:
        cni_args = f"IgnoreUnknown=1;MAC={bad}"
    err = _error(MacvlanPlugin(), conf, cni_args=cni_args)
    assert err.code == PLUGIN_ERROR
    assert err.msg == f"invalid args {bad} for MAC addr: address {bad}: invalid MAC address"


@pytest.mark.parametrize(
    ("where", "code"),
    [("config", 7), ("runtimeConfig", 7), ("CNI_ARGS", 4)],
)
@pytest.mark.parametrize(
    ("mac", "problem"),
    [
        ("01:00:5e:00:00:01", "is a multicast address (its first octet is odd)"),
        ("00:00:00:00:00:00", "is all zeros"),
        ("ff:ff:ff:ff:ff:ff", "is the broadcast address"),
    ],
)
def test_macvlan_mac_that_no_station_may_have(
    where: str, code: int, mac: str, problem: str
) -> None:
    """The kernel would refuse it (EADDRNOTAVAIL, passed on as 999): refused first, with
    the code of where it came from; DEL of such a config still goes on."""
    conf, cni_args = _macvlan(), ""
    if where == "config":
        conf["mac"] = mac
    elif where == "runtimeConfig":
        conf["runtimeConfig"] = {"mac": mac}
    else:
        cni_args = f"IgnoreUnknown=1;MAC={mac}"
    err = _error(MacvlanPlugin(), conf, cni_args=cni_args)
    label = {"config": "mac", "runtimeConfig": "runtimeConfig.mac", "CNI_ARGS": "CNI_ARGS MAC"}
    assert (err.code, err.msg) == (
        code,
        f'invalid {label[where]}: "{mac}" {problem}: not a station address',
    )
    assert MacvlanPlugin().load(_args(conf, "DEL", cni_args), "DEL").mac == mac


def test_macvlan_mac_precedence_config_then_cni_args_then_runtime_config() -> None:
    plugin = MacvlanPlugin()
    conf = _macvlan(mac="02:00:00:00:00:01")
    assert plugin.load(_args(conf), "ADD").mac == "02:00:00:00:00:01"
    args = "IgnoreUnknown=1;MAC=02:00:00:00:00:02"
    assert plugin.load(_args(conf, cni_args=args), "ADD").mac == "02:00:00:00:00:02"
    conf["runtimeConfig"] = {"mac": "02:00:00:00:00:03"}
    assert plugin.load(_args(conf, cni_args=args), "ADD").mac == "02:00:00:00:00:03"


@pytest.mark.parametrize("text", ["02:AB:cd:00:00:01", "02-ab-cd-00-00-01", "02ab.cd00.0001"])
def test_parse_mac_accepts_go_notations(text: str) -> None:
    assert parse_mac(text) == "02:ab:cd:00:00:01"


@pytest.mark.parametrize("text", ["", "02:ab:cd:00:00", "02:ab:cd:00:00:01:02", "0:1:2:3:4:5"])
def test_parse_mac_rejects(text: str) -> None:
    with pytest.raises(CNIError):
        parse_mac(text)


def test_cni_args_unknown_keys_need_ignore_unknown() -> None:
    conf = _macvlan()
    err = _error(MacvlanPlugin(), conf, cni_args="FOO=1;K8S_POD_NAME=p")
    assert (err.code, err.msg) == (PLUGIN_ERROR, 'ARGS: unknown args ["FOO=1" "K8S_POD_NAME=p"]')
    assert mac_from_cni_args(_args(conf, cni_args="IgnoreUnknown=true;FOO=1")) == ""
    err = _error(MacvlanPlugin(), conf, cni_args="IgnoreUnknown=maybe")
    assert err.msg.startswith('ARGS: error parsing value of pair "IgnoreUnknown=maybe"')


def test_macvlan_ipam_and_dns_types() -> None:
    err = _error(MacvlanPlugin(), _macvlan(ipam="host-local"))
    assert err.msg.endswith("into Go struct field NetConf.ipam of type types.IPAM")
    err = _error(MacvlanPlugin(), _macvlan(ipam={"type": 7}))
    assert err.msg.endswith("into Go struct field IPAM.type of type string")
    conf = MacvlanPlugin().load(_args(_macvlan(dns={"nameservers": ["10.0.0.1"]})), "ADD")
    assert conf.dns.nameservers == ["10.0.0.1"]


def test_macvlan_check_needs_prev_result_before_touching_the_pod() -> None:
    err = _error(MacvlanPlugin(), _macvlan(), "CHECK")
    assert (err.code, err.msg) == (PLUGIN_ERROR, "Required prevResult missing")


def test_status_and_gc_succeed_without_ipam() -> None:
    conf = {**_macvlan(), "cniVersion": "1.1.0"}
    for plugin in (MacvlanPlugin(), IPvlanPlugin()):
        assert dispatch(plugin, _args(conf, "STATUS")) == b""
        assert dispatch(plugin, _args(conf, "GC")) == b""


def test_del_without_netns_and_ipam_is_a_no_op() -> None:
    args = _args(_macvlan(mode="nonsense"), "DEL")
    args = CmdArgs(**{**args.__dict__, "netns": ""})
    assert dispatch(MacvlanPlugin(), args) == b""


def test_del_with_a_missing_netns_succeeds() -> None:
    assert dispatch(MacvlanPlugin(), _args(_macvlan(), "DEL")) == b""
    assert dispatch(IPvlanPlugin(), _args(_ipvlan(), "DEL")) == b""


def test_version_is_answered_in_process() -> None:
    out = json.loads(dispatch(MacvlanPlugin(), _args({}, "VERSION")))
    assert "1.0.0" in out["supportedVersions"]


# -- ipvlan --------------------------------------------------------------------------------

HOST_LOCAL = {"type": "host-local", "subnet": "10.1.0.0/24"}
PREV = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "uplink7"}],
    "ips": [{"address": "10.2.0.5/24", "interface": 0}],
}


@pytest.mark.parametrize("mode", ["bridge", "L2", "l4"])
def test_ipvlan_unknown_mode(mode: str) -> None:
    err = _error(IPvlanPlugin(), _ipvlan(mode=mode, ipam=HOST_LOCAL))
    assert (err.code, err.msg) == (PLUGIN_ERROR, f'unknown ipvlan mode: "{mode}"')


@pytest.mark.parametrize(("mode", "value"), [("", 0), ("l2", 0), ("l3", 1), ("l3s", 2)])
def test_ipvlan_modes(mode: str, value: int) -> None:
    plugin = IPvlanPlugin()
    conf = plugin.load(_args(_ipvlan(mode=mode, ipam=HOST_LOCAL)), "ADD")
    assert conf.mode == value
    assert plugin.mode_name(value) == (mode or "l2")


def test_ipvlan_without_ipam_and_without_prev_result() -> None:
    err = _error(IPvlanPlugin(), _ipvlan())
    assert err.code == PLUGIN_ERROR
    assert "ipam" in err.msg


def test_ipvlan_without_ipam_and_prev_result_without_ips() -> None:
    prev = {**PREV, "ips": []}
    err = _error(IPvlanPlugin(), _ipvlan(prevResult=prev))
    assert err.code == PLUGIN_ERROR
    assert "ipam" in err.msg


def test_ipvlan_chained_master_comes_from_the_single_prev_interface() -> None:
    conf = IPvlanPlugin().load(_args(_ipvlan(master="", prevResult=PREV)), "ADD")
    assert conf.master == "uplink7"
    assert conf.prev is not None and [str(i.address) for i in conf.prev.ips] == ["10.2.0.5/24"]


def test_ipvlan_explicit_master_wins_over_prev_result() -> None:
    conf = IPvlanPlugin().load(_args(_ipvlan(prevResult=PREV)), "ADD")
    assert conf.master == "up0"


@pytest.mark.parametrize(
    "interfaces", [[], [{"name": "a"}, {"name": "b"}], [{"name": "", "mac": "02:00:00:00:00:01"}]]
)
def test_ipvlan_chained_master_failure(interfaces: list[dict[str, str]]) -> None:
    prev = {**PREV, "interfaces": interfaces}
    err = _error(IPvlanPlugin(), _ipvlan(master="", prevResult=prev))
    assert (err.code, err.msg) == (
        PLUGIN_ERROR,
        "chained master failure. PrevResult lacks a single named interface",
    )


def test_ipvlan_bad_prev_result() -> None:
    err = _error(IPvlanPlugin(), _ipvlan(ipam=HOST_LOCAL, prevResult={"ips": "nope"}))
    assert err.code == PLUGIN_ERROR
    assert err.msg.startswith("could not parse prevResult")


def test_ipvlan_mtu_type() -> None:
    err = _error(IPvlanPlugin(), _ipvlan(mtu="9000", ipam=HOST_LOCAL))
    assert err.msg.endswith("Go struct field NetConf.mtu of type int")


def test_go_field_missing_or_null_gives_the_zero_value() -> None:
    assert go_field({}, "mtu", int, "int") == 0
    assert go_field({"master": None}, "master", str, "string") == ""
    assert go_field({"linkInContainer": True}, "linkInContainer", bool, "bool") is True
