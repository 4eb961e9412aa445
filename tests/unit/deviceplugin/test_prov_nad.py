"""SriovNetwork -> NetworkAttachmentDefinition (deviceplugin/provision/nad.py), compared byte for
byte with the operator's own golden files (api/v1/testdata/TestRendering/*.golden, read on
the operator's HEAD of 2026-08: its test encodes the NAD with Go's json, indent two spaces,
keys sorted, and its RESOURCE_PREFIX unset), and with what its controller writes to the API
(that config through Go's json.Indent with four spaces: go_indent was compared with Go's own
on these inputs and more)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from deviceplugin.provision.crs import SriovNetwork
from deviceplugin.provision.nad import RenderError, config_text, go_indent, nad, rendered

SIMPLE_CONFIG = (
    '{ "cniVersion":"1.0.0", "name":"test","type":"sriov","vlan":0,"vlanQoS":0,"ipam":{} }'
)
SIMPLE_GOLDEN = (
    """{
  "apiVersion": "k8s.cni.cncf.io/v1",
  "kind": "NetworkAttachmentDefinition",
  "metadata": {
    "annotations": {
      "k8s.v1.cni.cncf.io/resourceName": "/testresource",
      "sriovnetwork.openshift.io/owner-ref": "SriovNetwork.sriovnetwork.openshift.io/ns/test"
    },
    "name": "test",
    "namespace": "testnamespace"
  },
  "spec": {
    "config": """
    + json.dumps(SIMPLE_CONFIG)
    + """
  }
}
"""
)
CHAINED_CONFIG = (
    '{ "cniVersion":"1.0.0", "name":"test","plugins": [ {"type":"sriov","vlan":0,"vlanQoS":0,'
    '"ipam":{} },\n{ "type": "vrf", "vrfname": "blue" }\n] }'
)
# The golden test's metaPlugins: a Go raw string indented with tabs.
VRF = (
    '\n\t\t\t\t\t{\n\t\t\t\t\t\t"type": "vrf",\n\t\t\t\t\t\t"vrfname": "blue"\n\t\t\t\t\t}'
    "\n\t\t\t\t\t"
)


def network(name: str = "test", namespace: str = "ns", **spec: Any) -> SriovNetwork:
    body = {"networkNamespace": "testnamespace", "resourceName": "testresource", **spec}
    return SriovNetwork.from_api({"metadata": {"name": name, "namespace": namespace}, "spec": body})


def go_json(obj: Any) -> str:
    """What the operator's golden test writes: json.Encoder with SetIndent("", "  ")."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def test_simple_is_the_operators_golden_byte_for_byte() -> None:
    assert go_json(rendered(network(), prefix="")) == SIMPLE_GOLDEN


def test_chained_is_the_operators_golden_byte_for_byte() -> None:
    nad = rendered(network(metaPlugins=VRF), prefix="")
    assert nad["spec"]["config"] == CHAINED_CONFIG
    assert go_json(nad) == SIMPLE_GOLDEN.replace(
        json.dumps(rendered(network(), prefix="")["spec"]["config"]), json.dumps(CHAINED_CONFIG)
    )


def test_every_field_in_the_operators_order() -> None:
    full = network(
        vlan=100, vlanQoS=3, spoofChk="off", trust="on", vlanProto="802.1ad", minTxRate=0,
        maxTxRate=500, capabilities='{"mac": true}', linkState="enable", logLevel="info",
        logFile="/var/log/sriov.log", ipam='{ "type": "host-local",\n "subnet": "10.56.217.0/24" }',
    )  # fmt: skip
    assert config_text(full) == (
        '{ "cniVersion":"1.0.0", "name":"test","type":"sriov","vlan":100,"spoofchk":"off",'
        '"trust":"on","vlanQoS":3,"vlanProto":"802.1ad","min_tx_rate":0,"max_tx_rate":500,'
        '"capabilities":{"mac": true},"link_state":"enable","logLevel":"info",'
        '"logFile":"/var/log/sriov.log","ipam":{"type":"host-local","subnet":"10.56.217.0/24"} }'
    )


def test_the_resource_annotation_has_the_prefix_and_the_namespace_defaults_to_its_own() -> None:
    nad = rendered(network(name="net1", namespace="apps", networkNamespace=""), "openshift.io")
    meta = nad["metadata"]
    assert meta["namespace"] == "apps"
    assert meta["annotations"]["k8s.v1.cni.cncf.io/resourceName"] == "openshift.io/testresource"
    assert json.loads(nad["spec"]["config"])["name"] == "net1"


def test_a_quote_that_breaks_the_operators_yaml_is_a_render_error() -> None:
    with pytest.raises(RenderError, match="SriovNetwork ns/test cannot be rendered"):
        config_text(network(metaPlugins="{'type': 'tuning'}\n---\n"))


def test_the_nad_written_to_the_api_is_the_golden_config_indented_as_the_controller_does() -> None:
    assert nad(network(), "openshift.io")["spec"]["config"] == (
        '{\n    "cniVersion": "1.0.0",\n    "name": "test",\n    "type": "sriov",\n'
        '    "vlan": 0,\n    "vlanQoS": 0,\n    "ipam": {}\n}'
    )
    chained = nad(network(metaPlugins=VRF), "openshift.io")["spec"]["config"]
    assert chained == (
        '{\n    "cniVersion": "1.0.0",\n    "name": "test",\n    "plugins": [\n        {\n'
        '            "type": "sriov",\n            "vlan": 0,\n            "vlanQoS": 0,\n'
        '            "ipam": {}\n        },\n        {\n            "type": "vrf",\n'
        '            "vrfname": "blue"\n        }\n    ]\n}'
    )
    # Equal, as JSON, to the compact form the issue names.
    compact = '{"cniVersion":"1.0.0","name":"test","type":"sriov","vlan":0,"vlanQoS":0,"ipam":{}}'
    assert json.loads(nad(network(), "")["spec"]["config"]) == json.loads(compact)


def test_go_indent_keeps_tokens_byte_for_byte() -> None:
    text = '{"a":[],"c":{"d":"x\\"y","e":[{}]},"f":1.50e3,"g":"\\u00e9é"} \n'
    assert go_indent(text) == (
        '{\n    "a": [],\n    "c": {\n        "d": "x\\"y",\n        "e": [\n            {}\n'
        '        ]\n    },\n    "f": 1.50e3,\n    "g": "\\u00e9é"\n} \n'
    )
    with pytest.raises(RenderError, match="not JSON"):
        go_indent('{"capabilities":foo}')
