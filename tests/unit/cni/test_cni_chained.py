"""Plugins chained from `<dir>/<network name>/` onto a conflist read from a file, as libcni
1.3 loads them (containernetworking/cni#1052): cni.config.with_chained_plugins, and where
Plexus reads network configs from files (meta.attachments, meta.daemon.cniconfig)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cni.config import with_chained_plugins
from cni.errors import CNIError, ErrorCode
from cni.version import select_version
from meta.attachments import Resolver, find_conf_file
from meta.config import MetaConfig
from meta.daemon.cniconfig import ConfigWriter
from meta.daemon.config import DaemonConfig

BRIDGE = {"type": "bridge", "bridge": "br0"}
TUNING = {"type": "tuning", "sysctl": {"net.ipv4.conf.eth0.arp_filter": "1"}}
PORTMAP = {"type": "portmap", "capabilities": {"portMappings": True}}


def _conflist(name: str = "net", **extra: Any) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": name, "plugins": [BRIDGE], **extra}


def _write(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def _types(conf: dict[str, Any]) -> list[str]:
    return [p["type"] for p in conf["plugins"]]


def test_conf_files_of_the_network_subdirectory_are_appended_in_file_name_order(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "10-net.conflist", _conflist())
    _write(tmp_path / "net" / "50-tuning.conf", TUNING)
    _write(tmp_path / "net" / "20-portmap.conf", PORTMAP)
    conf = with_chained_plugins(json.loads(path.read_text()), path)
    assert _types(conf) == ["bridge", "portmap", "tuning"]
    assert conf["plugins"][2] == TUNING  # as written: name and cniVersion come at exec time


def test_only_dot_conf_files_count_and_subdirectories_are_skipped(tmp_path: Path) -> None:
    path = _write(tmp_path / "10-net.conflist", _conflist())
    for name in ("a.conflist", "b.json", "c.conf.bak", "README"):
        _write(tmp_path / "net" / name, TUNING)
    _write(tmp_path / "net" / "d.conf" / "e.conf", TUNING)  # a directory named *.conf
    assert _types(with_chained_plugins(_conflist(), path)) == ["bridge"]


def test_no_subdirectory_or_another_network_s_leaves_the_config_as_is(tmp_path: Path) -> None:
    path = _write(tmp_path / "10-net.conflist", _conflist())
    _write(tmp_path / "other" / "50-tuning.conf", TUNING)
    conf = _conflist()
    assert with_chained_plugins(conf, path) is conf


@pytest.mark.parametrize("value", [True, "true", "True"])
def test_load_only_inlined_plugins_opts_out(tmp_path: Path, value: Any) -> None:
    path = _write(tmp_path / "10-net.conflist", _conflist())
    _write(tmp_path / "net" / "50-tuning.conf", TUNING)
    conf = _conflist(loadOnlyInlinedPlugins=value)
    assert _types(with_chained_plugins(conf, path)) == ["bridge"]
    assert _types(with_chained_plugins(_conflist(loadOnlyInlinedPlugins=False), path)) == [
        "bridge",
        "tuning",
    ]


def test_load_only_inlined_plugins_must_be_a_boolean(tmp_path: Path) -> None:
    path = _write(tmp_path / "10-net.conflist", _conflist())
    with pytest.raises(CNIError) as caught:
        with_chained_plugins(_conflist(loadOnlyInlinedPlugins="maybe"), path)
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert "loadOnlyInlinedPlugins" in caught.value.msg


@pytest.mark.parametrize("filename", ["10-net.conf", "10-net.json"])
def test_a_single_plugin_file_gets_no_chain(tmp_path: Path, filename: str) -> None:
    """Runtimes read .conf and .json files as one plugin (go-cni's ConfFromFile)."""
    single = {"cniVersion": "1.0.0", "name": "net", **BRIDGE}
    path = _write(tmp_path / filename, single)
    _write(tmp_path / "net" / "50-tuning.conf", TUNING)
    assert with_chained_plugins(single, path) is single


def test_a_conflist_without_plugins_takes_them_all_from_its_subdirectory(tmp_path: Path) -> None:
    conf = {"cniVersion": "1.0.0", "name": "net"}
    path = _write(tmp_path / "10-net.conflist", conf)
    _write(tmp_path / "net" / "50-tuning.conf", TUNING)
    assert _types(with_chained_plugins(conf, path)) == ["tuning"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ({"sysctl": {}}, "has no 'type'"),
        ({"type": "../../bin/sh"}, "has invalid type"),
        (["tuning"], "must be a JSON object"),
    ],
)
def test_a_chained_file_that_is_no_plugin_fails_the_network_naming_it(
    tmp_path: Path, content: Any, words: str
) -> None:
    path = _write(tmp_path / "10-net.conflist", _conflist())
    bad = _write(tmp_path / "net" / "50-bad.conf", content)
    with pytest.raises(CNIError) as caught:
        with_chained_plugins(_conflist(), path)
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert str(bad) in caught.value.msg and words in caught.value.msg


def test_a_network_name_that_is_not_a_path_component_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "sub" / "10-net.conflist", _conflist())
    _write(tmp_path / "50-tuning.conf", TUNING)
    with pytest.raises(CNIError) as caught:
        with_chained_plugins(_conflist(name=".."), path)
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert "invalid characters found in network name '..'" in caught.value.msg


# -- where Plexus reads configs from files ---------------------------------------------


def test_a_conf_file_found_by_name_is_chained(tmp_path: Path) -> None:
    _write(tmp_path / "10-net.conflist", _conflist())
    _write(tmp_path / "net" / "50-tuning.conf", TUNING)
    found = find_conf_file(str(tmp_path), "net")
    assert found is not None and _types(found) == ["bridge", "tuning"]


def test_the_cluster_network_from_a_path_is_chained_and_so_recorded(tmp_path: Path) -> None:
    path = _write(tmp_path / "net.d" / "10-net.conflist", _conflist())
    _write(tmp_path / "net.d" / "net" / "50-tuning.conf", TUNING)
    conf = MetaConfig.model_validate(
        {"cniVersion": "1.1.0", "name": "p", "type": "plexus", "clusterNetwork": str(path)}
    )
    (default,) = Resolver(conf, None, "eth0").resolve(None)
    assert default.chain == "bridge+tuning"  # the record saves this config: DEL and CHECK run it
    assert default.network_config().plugins == [BRIDGE, TUNING]


def _writer(net_d: Path) -> ConfigWriter:
    conf = DaemonConfig.model_validate(
        {"cniVersion": "1.0.0", "name": "p", "type": "plexus", "cniConfigDir": str(net_d)}
    )
    return ConfigWriter(conf, interval=3600)


def _delegate_types(generated: Path) -> list[str]:
    plugin = json.loads(generated.read_text())["plugins"][0]
    (primary,) = plugin["delegates"]
    return _types(primary)


def test_the_generated_conflist_wraps_the_primary_with_its_chain(tmp_path: Path) -> None:
    _write(tmp_path / "10-net.conflist", _conflist())
    writer = _writer(tmp_path)
    generated = tmp_path / "00-plexus.conflist"
    assert writer.sync()
    assert _delegate_types(generated) == ["bridge"]

    _write(tmp_path / "net" / "50-tuning.conf", TUNING)
    assert writer.sync()
    assert _delegate_types(generated) == ["bridge", "tuning"]
    (tmp_path / "net" / "50-tuning.conf").unlink()
    assert writer.sync()
    assert _delegate_types(generated) == ["bridge"]


def test_our_own_network_s_chain_is_inlined_for_every_runtime(tmp_path: Path) -> None:
    """libcni before 1.3 never reads `<net.d>/plexus-cni-network/`, containerd 2.x does
    not notice it change: inlined (and not read again by a libcni 1.3 runtime)."""
    _write(tmp_path / "10-net.conflist", _conflist())
    writer = _writer(tmp_path)
    generated = tmp_path / "00-plexus.conflist"
    _write(tmp_path / "plexus-cni-network" / "60-portmap.conf", PORTMAP)
    assert writer.sync()
    conf = json.loads(generated.read_text())
    assert conf["name"] == "plexus-cni-network" and conf["loadOnlyInlinedPlugins"] is True
    assert _types(conf) == ["plexus", "portmap"] and conf["plugins"][1] == PORTMAP
    assert _delegate_types(generated) == ["bridge"]  # the primary's chain is not ours
    assert with_chained_plugins(conf, generated) is conf  # a libcni 1.3 runtime adds nothing
    assert "cniVersions" not in conf  # portmap runs at the primary's 1.0.0 everywhere

    (tmp_path / "plexus-cni-network" / "60-portmap.conf").unlink()
    assert writer.sync()
    conf = json.loads(generated.read_text())
    assert _types(conf) == ["plexus"]
    # Alone, Plexus offers 1.1.0 to a libcni that reads cniVersions (STATUS), 1.0.0 to others.
    assert (conf["cniVersion"], conf["cniVersions"]) == ("1.0.0", ["1.0.0", "1.1.0"])
    assert select_version(conf) == "1.1.0"


@pytest.mark.parametrize("version", ["1.1.0", "0.3.1"])
def test_cni_versions_only_when_they_add_1_1_0(tmp_path: Path, version: str) -> None:
    _write(tmp_path / "10-net.conflist", {**_conflist(), "cniVersion": version})
    assert _writer(tmp_path).sync()
    conf = json.loads((tmp_path / "00-plexus.conflist").read_text())
    expected = [version, "1.1.0"] if version != "1.1.0" else None
    assert (conf["cniVersion"], conf.get("cniVersions")) == (version, expected)


@pytest.mark.parametrize("directory", ["net", "plexus-cni-network"])
def test_a_broken_chained_file_keeps_the_last_generated_conflist(
    tmp_path: Path, directory: str
) -> None:
    _write(tmp_path / "10-net.conflist", _conflist())
    _write(tmp_path / directory / "50-tuning.conf", TUNING)
    writer = _writer(tmp_path)
    assert writer.sync()
    generated = tmp_path / "00-plexus.conflist"
    before = generated.read_bytes()
    _write(tmp_path / directory / "60-bad.conf", {"sysctl": {}})
    assert not writer.sync()
    assert generated.read_bytes() == before
