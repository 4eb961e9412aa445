"""Resolution of a pod's networks into delegates, on a real embedded store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni.errors import CNIError, ErrorCode
from meta.attachments import NetworkNotFound, Resolver
from meta.config import MetaConfig
from meta.delegate import Delegate
from meta.sources.base import Pod
from meta.sources.store import EmbeddedStore

BRIDGE = {"cniVersion": "1.0.0", "name": "cluster", "type": "bridge"}
MACVLAN = {"cniVersion": "1.0.0", "type": "macvlan", "master": "eth1"}


@pytest.fixture
def store(tmp_path: Path) -> EmbeddedStore:
    return EmbeddedStore(tmp_path)


def _nad(
    store: EmbeddedStore, name: str, config: dict[str, Any] | str, namespace: str = "default"
) -> None:
    text = config if isinstance(config, str) else json.dumps(config)
    body = {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"config": text},
    }
    (store.directory / f"{namespace}-{name}.yaml").write_text(yaml.safe_dump(body))


def _conf(**extra: Any) -> MetaConfig:
    base: dict[str, Any] = {
        "cniVersion": "1.1.0",
        "name": "plexus",
        "type": "plexus",
        "delegates": [BRIDGE],
        "clusterDir": "/unused",
    }
    base.update(extra)
    return MetaConfig.model_validate(base)


def _pod(
    networks: str | list[dict[str, Any]] = "", namespace: str = "default", **annotations: str
) -> Pod:
    notes = dict(annotations)
    if networks:
        notes["k8s.v1.cni.cncf.io/networks"] = (
            networks if isinstance(networks, str) else json.dumps(networks)
        )
    return Pod(namespace=namespace, name="p", uid="u", annotations=notes)


def _resolve(store: EmbeddedStore, pod: Pod, **conf: Any) -> list[Delegate]:
    return Resolver(_conf(**conf), store, "eth0").resolve(pod)


def test_order_names_and_interfaces(store: EmbeddedStore) -> None:
    _nad(store, "a", MACVLAN)
    _nad(store, "b", MACVLAN, namespace="other")
    _nad(store, "dflt", MACVLAN, namespace="kube-system")
    delegates = _resolve(store, _pod("a, other/b@data0, a@x"), defaultNetworks=["dflt"])
    assert [(d.network, d.ifname, d.default) for d in delegates] == [
        ("cluster", "eth0", True),
        ("kube-system/dflt", "net1", False),
        ("default/a", "net2", False),
        ("other/b", "data0", False),
        ("default/a", "x", False),
    ]
    assert delegates[2].config["name"] == "a"  # injected: the NAD's config had no name


def test_system_namespaces_get_no_default_networks(store: EmbeddedStore) -> None:
    _nad(store, "dflt", MACVLAN, namespace="kube-system")
    pod = _pod(namespace="kube-system")
    assert len(_resolve(store, pod, defaultNetworks=["dflt"])) == 1


def test_without_cluster_source_every_delegate_is_attached() -> None:
    conf = _conf(delegates=[BRIDGE, {**MACVLAN, "name": "m"}])
    delegates = Resolver(conf, None, "eth0").resolve(None)
    assert [(d.network, d.ifname, d.default) for d in delegates] == [
        ("cluster", "eth0", True),
        ("m", "net1", False),
    ]


def test_conflist_nad_and_cni_args_and_device_id(store: EmbeddedStore) -> None:
    _nad(
        store,
        "chain",
        {"cniVersion": "1.0.0", "name": "chain", "plugins": [MACVLAN, {"type": "tuning"}]},
    )
    delegates = _resolve(
        store, _pod([{"name": "chain", "cni-args": {"k": "v"}, "deviceID": "0000:01:00.1"}])
    )
    plugins = delegates[1].config["plugins"]
    assert [p["args"]["cni"] for p in plugins] == [{"k": "v"}, {"k": "v"}]
    assert [p["deviceID"] for p in plugins] == ["0000:01:00.1"] * 2


def test_cni_args_merge_with_existing_args(store: EmbeddedStore) -> None:
    _nad(store, "m", {**MACVLAN, "args": {"cni": {"keep": 1}, "other": True}})
    delegate = _resolve(store, _pod([{"name": "m", "cni-args": {"add": 2}}]))[1]
    assert delegate.config["args"] == {"cni": {"keep": 1, "add": 2}, "other": True}


def test_capabilities_from_the_selection(store: EmbeddedStore) -> None:
    _nad(store, "m", {**MACVLAN, "capabilities": {"ips": True, "mac": True}})
    delegate = _resolve(
        store,
        _pod([{"name": "m", "ips": ["10.1.1.1/24"], "mac": "02:00:00:00:00:01"}]),
        runtimeConfig={"portMappings": []},
    )[1]
    assert delegate.capability_args == {
        "portMappings": [],
        "ips": ["10.1.1.1/24"],
        "mac": "02:00:00:00:00:01",
    }


def test_capability_nobody_supports_is_an_error(store: EmbeddedStore) -> None:
    _nad(store, "m", MACVLAN)
    with pytest.raises(CNIError) as caught:
        _resolve(store, _pod([{"name": "m", "ips": ["10.1.1.1/24"]}]))
    assert caught.value.code == ErrorCode.UNSUPPORTED_FIELD
    assert "default/m" in caught.value.msg and "ips" in caught.value.msg


def test_empty_nad_config_uses_the_conf_file_of_that_name(
    store: EmbeddedStore, tmp_path: Path
) -> None:
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    (conf_dir / "10-other.conf").write_text(json.dumps({**MACVLAN, "name": "other"}))
    (conf_dir / "20-m.conflist").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "m", "plugins": [MACVLAN]})
    )
    _nad(store, "m", "")
    delegate = _resolve(store, _pod("m"), confDir=str(conf_dir))[1]
    assert delegate.config["name"] == "m" and "plugins" in delegate.config


def test_missing_nad(store: EmbeddedStore) -> None:
    with pytest.raises(NetworkNotFound) as caught:
        _resolve(store, _pod("ghost"))
    assert caught.value.ref == "default/ghost"


@pytest.mark.parametrize(
    ("config", "code", "words"),
    [
        ("{oops", ErrorCode.DECODE_FAILURE, "not valid JSON"),
        ("[1]", ErrorCode.INVALID_CONFIG, "JSON object"),
        ('{"name": "x"}', ErrorCode.INVALID_CONFIG, "neither a 'type' nor a 'plugins'"),
    ],
)
def test_bad_nad_configs(store: EmbeddedStore, config: str, code: int, words: str) -> None:
    _nad(store, "bad", config)
    with pytest.raises(CNIError) as caught:
        _resolve(store, _pod("bad"))
    assert caught.value.code == code and words in str(caught.value)
    assert "default/bad" in str(caught.value)


def test_default_network_annotation_replaces_the_cluster_network(store: EmbeddedStore) -> None:
    _nad(store, "alt", {**MACVLAN, "name": "alt"}, namespace="kube-system")
    pod = _pod(**{"v1.multus-cni.io/default-network": "alt"})
    delegate = _resolve(store, pod)[0]
    assert (delegate.network, delegate.ifname, delegate.default) == ("alt", "eth0", True)
    assert delegate.config["type"] == "macvlan"


def test_cluster_network_by_nad_name(store: EmbeddedStore) -> None:
    _nad(store, "primary", {**BRIDGE, "name": "primary"}, namespace="kube-system")
    delegates = _resolve(store, _pod(), clusterNetwork="primary", delegates=[])
    assert delegates[0].config["type"] == "bridge" and delegates[0].default


def test_duplicate_interface_is_an_error(store: EmbeddedStore) -> None:
    _nad(store, "m", MACVLAN)
    with pytest.raises(CNIError, match="interface eth0 is requested by both"):
        _resolve(store, _pod("m@eth0"))
