"""Multus thick's daemon-config.json as Plexus's daemon config: each key honoured or refused
with a message saying what to do (meta/daemon/config.py, docs/migrating-from-multus.md)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from cni.errors import CNIError, ErrorCode
from meta.cli import load_node_config
from meta.daemon.cniconfig import ConfigWriter
from meta.daemon.config import DAEMON_ONLY_KEYS, DaemonConfig, load_daemon_config

# The ConfigMap of multus-cni v4.2.4's deployments/multus-daemonset-thick.yml, verbatim.
MULTUS_THICK = """{
    "chrootDir": "/hostroot",
    "cniVersion": "0.3.1",
    "logLevel": "verbose",
    "logToStderr": true,
    "cniConfigDir": "/host/etc/cni/net.d",
    "multusAutoconfigDir": "/host/etc/cni/net.d",
    "multusConfigFile": "auto",
    "socketDir": "/host/run/multus/"
}"""


def _multus(**changes: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {**json.loads(MULTUS_THICK), "type": "plexus", **changes}
    return {k: v for k, v in conf.items() if v is not None}


def _write(tmp_path: Path, conf: dict[str, Any]) -> Path:
    path = tmp_path / "daemon-config.json"
    path.write_text(json.dumps(conf))
    return path


def test_multus_thick_daemon_config_loads_with_type_plexus(tmp_path: Path) -> None:
    conf = load_daemon_config(_write(tmp_path, _multus()))
    assert (conf.chroot_dir, conf.cni_version, conf.log_level, conf.log_to_stderr) == (
        "/hostroot",
        "0.3.1",
        "verbose",
        True,
    )
    assert conf.cni_conf_dir == "/host/etc/cni/net.d"  # the conflist is generated there
    assert conf.socket_dir == "/host/run/multus/"
    assert conf.name == "plexus-cni-network"  # Multus's file has no name


def test_without_type_it_is_refused_naming_type(tmp_path: Path) -> None:
    with pytest.raises(CNIError) as caught:
        load_daemon_config(_write(tmp_path, _multus(type=None)))
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert "type: Field required" in str(caught.value)


def test_multus_config_file_auto_generates_the_conflist_as_multus_does(tmp_path: Path) -> None:
    net_d = tmp_path / "net.d"
    net_d.mkdir()
    (net_d / "10-flannel.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "0.3.1",
                "name": "cbr0",
                "plugins": [
                    {"type": "flannel"},
                    {"type": "portmap", "capabilities": {"portMappings": True}},
                ],
            }
        )
    )
    conf = DaemonConfig.model_validate(
        _multus(cniConfigDir=str(net_d), multusAutoconfigDir=f"{net_d}/")
    )
    assert ConfigWriter(conf, interval=3600).sync()
    generated = json.loads((net_d / "00-plexus.conflist").read_text())
    (plugin,) = generated["plugins"]
    assert generated["cniVersion"] == "0.3.1" and plugin["delegates"][0]["name"] == "cbr0"
    assert plugin["capabilities"] == {"portMappings": True}
    assert plugin["chrootDir"] == "/hostroot" and plugin["socketDir"] == "/host/run/multus/"
    assert not set(plugin) & (DAEMON_ONLY_KEYS - {"socketDir"})  # no daemon key per call


def test_auto_without_cni_config_dir_means_multus_default() -> None:
    conf = DaemonConfig.model_validate(_multus(cniConfigDir=None, multusAutoconfigDir=None))
    assert conf.cni_conf_dir == "/etc/cni/net.d"


def test_plexus_alone_generates_nothing_without_cni_config_dir() -> None:
    conf = DaemonConfig.model_validate({"cniVersion": "1.0.0", "type": "plexus"})
    assert conf.cni_conf_dir == ""


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("multusConfigFile", "/tmp/multus.conf", "set cniConfigDir"),
        ("multusAutoconfigDir", "/etc/cni/other", "set both to the same directory"),
        ("multusMasterCNI", "10-calico.conflist", "set clusterNetwork"),
        ("forceCNIVersion", True, "remove forceCNIVersion"),
        ("overrideNetworkName", True, "named plexus-cni-network"),
        ("daemonSocketDir", "/run/multus/", "set socketDir to it"),
        ("perNodeCertificate", {"enabled": True, "certDir": "/x"}, "in-cluster service account"),
        ("auxiliaryCNIChainName", "vendor-chain", "<primary network name>/ (chained onto"),
    ],
)
def test_a_multus_key_plexus_cannot_honour_is_refused_saying_what_to_do(
    tmp_path: Path, key: str, value: Any, words: str
) -> None:
    with pytest.raises(CNIError) as caught:
        load_daemon_config(_write(tmp_path, _multus(**{key: value})))
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    message = str(caught.value)
    assert key in message and words in message and "Traceback" not in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("forceCNIVersion", False),
        ("overrideNetworkName", False),
        ("perNodeCertificate", {"enabled": False}),
        ("daemonSocketDir", "/host/run/multus"),  # the same dir as socketDir
        ("multusAutoconfigDir", "/host/etc/cni/net.d/"),
        ("auxiliaryCNIChainName", ""),
        ("metricsPort", 0),
    ],
)
def test_a_multus_key_with_a_value_plexus_honours_loads(key: str, value: Any) -> None:
    conf = DaemonConfig.model_validate(_multus(**{key: value}))
    assert conf.model_extra == {}


def test_unknown_and_ignored_keys_are_warned_once_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(tmp_path, _multus(cniConfigdir="/typo", logOptions={"maxAge": 5}))
    with caplog.at_level(logging.WARNING, logger="plexus.config"):
        load_daemon_config(path)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "unknown daemon config keys ignored: cniConfigdir",
        "logOptions ignored: Plexus does not rotate logFile; rotate it with logrotate's "
        "copytruncate",
    ]


def test_inspect_reads_a_daemon_config_and_the_generated_conflist(tmp_path: Path) -> None:
    daemon = _write(tmp_path, _multus(cniDir=str(tmp_path / "state")))
    assert load_node_config(str(daemon)).cni_dir == str(tmp_path / "state")
    net_d = tmp_path / "net.d"
    net_d.mkdir()
    (net_d / "10-bridge.conf").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "br", "type": "bridge"})
    )
    conf = DaemonConfig.model_validate(
        _multus(cniConfigDir=str(net_d), multusAutoconfigDir=None, cniDir=str(tmp_path / "s2"))
    )
    assert ConfigWriter(conf, interval=3600).sync()
    meta = load_node_config(str(net_d / "00-plexus.conflist"))
    assert (meta.name, meta.cni_version, meta.cni_dir) == (
        "plexus-cni-network",
        "1.1.0",  # its cniVersions' highest, as libcni 1.3 reads it
        str(tmp_path / "s2"),
    )


def test_inspect_refuses_a_conflist_without_a_plexus_plugin(tmp_path: Path) -> None:
    path = tmp_path / "10-bridge.conflist"
    path.write_text(json.dumps({"cniVersion": "1.0.0", "name": "br", "plugins": [{"type": "x"}]}))
    with pytest.raises(CNIError, match="no plexus plugin in network 'br'"):
        load_node_config(str(path))
