"""Resolution of a pod's networks into delegates, on a real embedded store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni.errors import CNIError, ErrorCode
from cni.result import Result
from meta.attachments import NetworkNotFound, Resolver, unhonoured_requests
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
        _resolve(store, _pod([{"name": "m", "bandwidth": {"ingressRate": 1}}]))
    assert caught.value.code == ErrorCode.UNSUPPORTED_FIELD
    assert "default/m" in caught.value.msg and "bandwidth" in caught.value.msg


def test_ips_and_mac_travel_in_cni_args_as_multus_sends_them(store: EmbeddedStore) -> None:
    """Multus 4.2 adds IgnoreUnknown=true, MAC= and IP= (ips joined by commas) whether or
    not a plugin declares the capability; runtimeConfig only carries declared ones."""
    _nad(store, "plain", MACVLAN)
    _nad(store, "caps", {**MACVLAN, "capabilities": {"mac": True}})
    selection = {"ips": ["10.1.1.1/24", "fd00::1/64"], "mac": "02:00:00:00:00:01"}
    pod = _pod([{"name": "plain", **selection}, {"name": "caps", **selection}])
    plain, caps = _resolve(store, pod)[1:]
    pairs = [
        ("IgnoreUnknown", "true"),
        ("MAC", "02:00:00:00:00:01"),
        ("IP", "10.1.1.1/24,fd00::1/64"),
    ]
    assert plain.cni_args == caps.cni_args == pairs
    runtime = (("IgnoreUnknown", "1"), ("K8S_POD_NAME", "p"), ("IP", "10.9.9.9"))
    assert plain.runtime_args(runtime) == (("K8S_POD_NAME", "p"), *pairs)


def test_unhonoured_ips_and_mac_are_reported() -> None:
    delegate = Delegate(
        network="default/m",
        ifname="net1",
        config=MACVLAN,
        cni_args=[("IgnoreUnknown", "true"), ("MAC", "02-00-00-00-00-01"), ("IP", "10.1.1.1/24")],
    )

    def result(ip: str, mac: str) -> Result:
        return Result.from_dict(
            {
                "cniVersion": "1.0.0",
                "interfaces": [{"name": "net1", "mac": mac, "sandbox": "/run/netns/x"}],
                "ips": [{"address": ip, "interface": 0}],
            }
        )

    assert unhonoured_requests(delegate, result("10.1.1.1/24", "02:00:00:00:00:01")) == []
    problems = unhonoured_requests(delegate, result("10.1.1.7/24", "0a:00:00:00:00:09"))
    assert [p.split(": ", 1)[1].split(";")[0] for p in problems] == [
        "the pod asked for ips 10.1.1.1 (got 10.1.1.7)",
        "the pod asked for mac 02-00-00-00-00-01 (got 0a:00:00:00:00:09)",
    ]
    assert all(p.startswith("network default/m (net1)") for p in problems)


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
        ("{oops", ErrorCode.DECODE_FAILURE, "spec.config: invalid JSON at line 1 column 2"),
        pytest.param(
            "[" * 65 + "]" * 65,
            ErrorCode.DECODE_FAILURE,
            "spec.config is nested deeper than 64",
            id="nested-65-levels",
        ),
        pytest.param(
            "[" * 100_000 + "]" * 100_000,
            ErrorCode.DECODE_FAILURE,
            "nested deeper than 64",
            id="nested-100000-levels",
        ),
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
    # Named as Multus names a NAD-based default network in network-status and events.
    assert (delegate.network, delegate.ifname, delegate.default) == (
        "kube-system/alt",
        "eth0",
        True,
    )
    assert delegate.config["type"] == "macvlan"


def test_cluster_network_by_nad_name(store: EmbeddedStore) -> None:
    _nad(store, "primary", {**BRIDGE, "name": "primary"}, namespace="kube-system")
    delegates = _resolve(store, _pod(), clusterNetwork="primary", delegates=[])
    assert delegates[0].config["type"] == "bridge" and delegates[0].default
    assert delegates[0].network == "kube-system/primary"  # not the config's name


def test_cluster_network_from_a_conf_file_takes_the_configs_name(
    store: EmbeddedStore, tmp_path: Path
) -> None:
    path = tmp_path / "99-primary.conf"
    path.write_text(json.dumps({**BRIDGE, "name": "inner"}))
    delegates = _resolve(store, _pod(), clusterNetwork=str(path), delegates=[])
    assert delegates[0].network == "inner"


def test_default_network_annotation_obeys_namespace_isolation(store: EmbeddedStore) -> None:
    _nad(store, "alt", {**MACVLAN, "name": "alt"}, namespace="other")
    _nad(store, "alt", {**MACVLAN, "name": "alt"}, namespace="kube-system")
    isolated = {"namespaceIsolation": True}
    refused = _pod(**{"v1.multus-cni.io/default-network": "other/alt"})
    with pytest.raises(CNIError) as caught:
        _resolve(store, refused, **isolated)
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert "pod default/p may not use network other/alt: namespaceIsolation" in caught.value.msg
    # Unqualified means multusNamespace, where Multus keeps default networks: allowed.
    plain = _pod(**{"v1.multus-cni.io/default-network": "alt"})
    assert _resolve(store, plain, **isolated)[0].network == "kube-system/alt"
    assert _resolve(store, refused, globalNamespaces="other", **isolated)[0].network == "other/alt"


def test_global_namespaces_default_to_default_as_in_multus(store: EmbeddedStore) -> None:
    _nad(store, "shared", MACVLAN)
    pod = _pod("default/shared", namespace="team")
    delegates = _resolve(store, pod, namespaceIsolation=True)
    assert delegates[1].network == "default/shared"
    with pytest.raises(CNIError, match="may not use network default/shared"):
        _resolve(store, pod, namespaceIsolation=True, globalNamespaces=["infra"])


def test_more_networks_than_max_networks_per_pod_is_refused_up_front(
    store: EmbeddedStore,
) -> None:
    _nad(store, "m", MACVLAN)
    with pytest.raises(CNIError) as caught:
        _resolve(store, _pod(",".join(["m"] * 33)))
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert caught.value.msg == (
        "the networks annotation of pod default/p asks for 33 networks; "
        "at most 32 are allowed (maxNetworksPerPod)"
    )
    with pytest.raises(CNIError, match="asks for 3 networks; at most 2"):
        _resolve(store, _pod([{"name": "m"}] * 3), maxNetworksPerPod=2)
    # The limit is checked before elements are validated or NADs looked up.
    with pytest.raises(CNIError, match="asks for 10000 networks"):
        _resolve(store, _pod(",".join(["no-such-nad"] * 10_000)))
    assert len(_resolve(store, _pod(",".join(["m"] * 32)))) == 33


@pytest.mark.parametrize("name", ["../x", "/abs/path", "a/b", ".hidden", "-x", "x y", ""])
def test_nad_config_name_must_be_a_cni_network_name(store: EmbeddedStore, name: str) -> None:
    _nad(store, "evil", {**MACVLAN, "name": name})
    with pytest.raises(CNIError) as caught:
        _resolve(store, _pod("evil"))
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert f"network default/evil: its config's name {name!r} is not a valid CNI" in str(
        caught.value
    )


def test_duplicate_interface_is_an_error(store: EmbeddedStore) -> None:
    _nad(store, "m", MACVLAN)
    with pytest.raises(CNIError, match="interface eth0 is requested by both"):
        _resolve(store, _pod("m@eth0"))
