from __future__ import annotations

import json
from typing import Any

import pytest

from cni.config import NetworkConfigList, load_network_config, plugin_stdin
from cni.errors import CNIError, ErrorCode


def load(obj: Any) -> NetworkConfigList:
    return load_network_config(json.dumps(obj).encode())


def test_single_conf_is_wrapped() -> None:
    raw = b'{"cniVersion":"0.4.0","name":"net","type":"bridge","bridge":"br0","disableCheck":true}'
    net = load_network_config(raw)
    assert net.name == "net"
    assert net.cni_version == "0.4.0"
    assert net.plugins == [json.loads(raw)]
    assert (net.is_list, net.disable_check, net.disable_gc) == (False, False, False)
    assert net.raw == raw


def test_conflist() -> None:
    conf = {
        "cniVersion": "1.0.0",
        "name": "chain",
        "disableCheck": True,
        "disableGC": "false",
        "plugins": [{"type": "macvlan", "master": "eth0", "x-unknown": [1]}, {"type": "tuning"}],
    }
    net = load(conf)
    assert net.is_list
    assert (net.name, net.cni_version) == ("chain", "1.0.0")
    assert net.plugins == conf["plugins"]
    assert (net.disable_check, net.disable_gc) == (True, False)


def test_cni_versions_picks_highest_supported() -> None:
    net = load(
        {"cniVersions": ["0.4.0", "1.1.0", "3.0.0"], "name": "n", "plugins": [{"type": "x"}]}
    )
    assert net.cni_version == "1.1.0"


@pytest.mark.parametrize("flag", ["1", "t", "TRUE", "True", True])
def test_flags_accept_go_booleans(flag: object) -> None:
    assert load({"name": "n", "disableGC": flag, "plugins": [{"type": "x"}]}).disable_gc


@pytest.mark.parametrize(
    ("obj", "words"),
    [
        ({"cniVersion": "1.0.0", "type": "bridge"}, "name"),
        ({"cniVersion": "1.0.0", "name": "", "type": "bridge"}, "name"),
        ({"cniVersion": "1.0.0", "plugins": [{"type": "bridge"}]}, "name"),
        ({"cniVersion": "1.0.0", "name": "n"}, "type"),
        ({"cniVersion": "1.0.0", "name": "n", "type": ""}, "type"),
        ({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a"}, {"b": 1}]}, "plugin 1"),
        ({"cniVersion": "1.0.0", "name": "n", "type": "../bin/evil"}, "'../bin/evil'"),
        ({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "/bin/sh"}]}, "'/bin/sh'"),
        ({"cniVersion": "1.0.0", "name": "n", "plugins": []}, "no plugins"),
        ({"cniVersion": "1.0.0", "name": "n", "plugins": {"type": "x"}}, "no plugins"),
        ({"cniVersion": "1.0.0", "name": "n", "plugins": ["x"]}, "JSON object"),
        ({"name": "n", "disableCheck": "yes", "plugins": [{"type": "x"}]}, "disableCheck"),
        ({"cniVersion": 1, "name": "n", "type": "x"}, "cniVersion"),
    ],
)
def test_invalid_configs(obj: dict[str, Any], words: str) -> None:
    with pytest.raises(CNIError) as exc:
        load(obj)
    assert exc.value.code == ErrorCode.INVALID_CONFIG
    assert words in exc.value.msg


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b'"x"', b"\xff\xfe\x00"])
def test_undecodable_configs(raw: bytes) -> None:
    with pytest.raises(CNIError) as exc:
        load_network_config(raw)
    assert exc.value.code == ErrorCode.DECODE_FAILURE


def test_unsupported_version() -> None:
    with pytest.raises(CNIError) as exc:
        load({"cniVersion": "2.0.0", "name": "n", "type": "x"})
    assert exc.value.code == ErrorCode.INCOMPATIBLE_VERSION


def test_plugin_stdin_injects_name_version_and_prev_result() -> None:
    net = load(
        {"cniVersion": "1.0.0", "name": "chain", "plugins": [{"type": "a", "name": "other"}]}
    )
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}], "dns": {}}
    conf = json.loads(plugin_stdin(net, net.plugins[0], {"portMappings": []}, prev))
    assert conf == {"type": "a", "name": "chain", "cniVersion": "1.0.0", "prevResult": prev}
    assert net.plugins[0]["name"] == "other"  # the list's plugin is not modified


def test_plugin_stdin_passes_only_declared_capabilities() -> None:
    plugin = {
        "type": "portmap",
        "capabilities": {"portMappings": True, "bandwidth": False, "ips": "true"},
    }
    net = load({"cniVersion": "1.0.0", "name": "n", "plugins": [plugin]})
    runtime = {
        "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 1},
        "ips": ["10.0.0.9/24"],
        "mac": "aa:bb:cc:dd:ee:ff",
    }
    conf = json.loads(plugin_stdin(net, plugin, runtime, None))
    assert conf["runtimeConfig"] == {"portMappings": runtime["portMappings"]}
    assert "prevResult" not in conf


def test_plugin_stdin_omits_empty_runtime_config() -> None:
    plugin = {"type": "bridge", "capabilities": {"mac": True}, "runtimeConfig": {"keep": 1}}
    net = load({"cniVersion": "1.0.0", "name": "n", "plugins": [plugin]})
    assert json.loads(plugin_stdin(net, plugin, {"ips": ["10.0.0.1/8"]}, None))[
        "runtimeConfig"
    ] == {"keep": 1}
    bare = {"type": "bridge"}
    assert "runtimeConfig" not in json.loads(plugin_stdin(net, bare, {"mac": "x"}, None))
