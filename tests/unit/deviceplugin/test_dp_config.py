"""The device plugin config.json (sriov-network-device-plugin format)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.config import (
    DEFAULT_PREFIX,
    ConfigError,
    load_config,
    parse_config,
    parse_vf_spec,
)


def conf(*resources: dict[str, Any]) -> str:
    return json.dumps({"resourceList": list(resources)})


def test_defaults_and_every_selector_key() -> None:
    sel = {
        "vendors": ["8086"],
        "devices": ["154C"],
        "drivers": ["iavf", "vfio-pci"],
        "pciAddresses": ["0000:3B:02.0"],
        "acpiIndexes": ["101"],
        "pfNames": ["ens1f0#0-3,7"],
        "rootDevices": ["0000:3b:00.0#1"],
        "linkTypes": ["Ether"],
        "isRdma": True,
        "needVhostNet": True,
        "vdpaType": "vhost",
    }
    config = parse_config(conf({"resourceName": "sriov_a", "selectors": [sel]}))
    (res,) = config.resource_list
    assert res.resource_prefix == DEFAULT_PREFIX == "intel.com"
    assert res.full_name == "intel.com/sriov_a"
    assert (res.device_type, res.exclude_topology, res.additional_info) == ("netDevice", False, {})
    (s,) = res.selectors
    assert s.devices == ["154c"]
    assert s.pci_addresses == ["0000:3b:02.0"]
    assert s.link_types == ["ether"]
    assert (s.pf_names, s.root_devices) == (["ens1f0#0-3,7"], ["0000:3b:00.0#1"])
    assert (s.is_rdma, s.need_vhost_net, s.vdpa_type) == (True, True, "vhost")


def test_resource_fields() -> None:
    config = parse_config(
        conf(
            {
                "resourceName": "mlx",
                "resourcePrefix": "nvidia.com",
                "deviceType": "netDevice",
                "excludeTopology": True,
                "additionalInfo": {"*": {"token": "3e49019f"}},
                "selectors": [{}],
            }
        )
    )
    (res,) = config.resource_list
    assert res.full_name == "nvidia.com/mlx"
    assert res.exclude_topology
    assert res.additional_info == {"*": {"token": "3e49019f"}}


def test_single_selector_object_is_a_list_of_one() -> None:
    config = parse_config(conf({"resourceName": "a", "selectors": {"vendors": ["8086"]}}))
    (s,) = config.resource_list[0].selectors
    assert s.vendors == ["8086"]


def test_empty_resource_list() -> None:
    assert parse_config(conf()).resource_list == []


def test_parse_vf_spec() -> None:
    assert parse_vf_spec("ens1f0") == ("ens1f0", None)
    assert parse_vf_spec("ens1f0#0-3,7") == ("ens1f0", frozenset({0, 1, 2, 3, 7}))
    assert parse_vf_spec("0000:3b:00.0#2") == ("0000:3b:00.0", frozenset({2}))
    for bad in ("#1", "p#", "p#a", "p#3-1", "p#1-", "p#-2", "p#1,,2"):
        with pytest.raises(ValueError):
            parse_vf_spec(bad)


@pytest.mark.parametrize(
    ("resource", "field"),
    [
        ({"selectors": [{}]}, "resourceList[0].resourceName"),
        ({"resourceName": "a b", "selectors": [{}]}, "resourceList[0].resourceName"),
        ({"resourceName": "a/b", "selectors": [{}]}, "resourceList[0].resourceName"),
        ({"resourceName": "-a", "selectors": [{}]}, "resourceList[0].resourceName"),
        (
            {"resourceName": "a", "resourcePrefix": "bad/prefix", "selectors": [{}]},
            "resourceList[0].resourcePrefix",
        ),
        (
            {"resourceName": "a", "deviceType": "accelerator", "selectors": [{}]},
            "resourceList[0].deviceType",
        ),
        ({"resourceName": "a"}, "resourceList[0].selectors"),
        ({"resourceName": "a", "selectors": []}, "resourceList[0].selectors"),
        (
            {"resourceName": "a", "selectors": [{"vendors": ["8086x"]}]},
            "resourceList[0].selectors[0].vendors",
        ),
        (
            {"resourceName": "a", "selectors": [{}, {"devices": "10ca"}]},
            "resourceList[0].selectors[1].devices",
        ),
        (
            {"resourceName": "a", "selectors": [{"pfNames": ["ens1f0#1-x"]}]},
            "resourceList[0].selectors[0].pfNames",
        ),
        (
            {"resourceName": "a", "selectors": [{"rootDevices": ["0000:3b:00.0#5-2"]}]},
            "resourceList[0].selectors[0].rootDevices",
        ),
        (
            {"resourceName": "a", "selectors": [{"vdpaType": "nope"}]},
            "resourceList[0].selectors[0].vdpaType",
        ),
        (
            {"resourceName": "a", "selectors": [{"isRdma": "maybe"}]},
            "resourceList[0].selectors[0].isRdma",
        ),
        (
            {"resourceName": "a", "selectors": [{"vendor": ["8086"]}]},
            "resourceList[0].selectors[0].vendor",
        ),
        ({"resourceName": "a", "selectors": [{}], "colour": 1}, "resourceList[0].colour"),
    ],
)
def test_errors_name_the_field(resource: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(conf({"resourceName": "ok", "selectors": [{}]}, resource))
    message = str(err.value).replace("resourceList[1]", "resourceList[0]")
    assert f"{field}:" in message, message
    assert "resourceList[1]" in str(err.value)


def test_unknown_field_message() -> None:
    with pytest.raises(ConfigError, match=r"selectors\[0\]\.ddpProfiles: unknown or unsupported"):
        parse_config(conf({"resourceName": "a", "selectors": [{"ddpProfiles": ["x"]}]}))


def test_bad_range_message() -> None:
    with pytest.raises(ConfigError, match=r"pfNames: 'p0#1-x': bad VF range '1-x'"):
        parse_config(conf({"resourceName": "a", "selectors": [{"pfNames": ["p0#1-x"]}]}))


def test_duplicate_resource() -> None:
    res = {"resourceName": "a", "selectors": [{}]}
    with pytest.raises(ConfigError, match=r"resourceList\[1\]\.resourceName: intel.com/a"):
        parse_config(conf(res, res))
    # The same name under another prefix is a different resource.
    parse_config(conf(res, {**res, "resourcePrefix": "example.com"}))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "device plugin config: invalid JSON"),
        ("[]", "JSON object"),
        ("{}", "resourceList: Field required"),
        ('{"resourceList": {}}', "resourceList:"),
    ],
)
def test_document_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(text)


def test_load_config(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(conf({"resourceName": "a", "selectors": [{}]}))
    assert load_config(path).resource_list[0].resource_name == "a"
    with pytest.raises(ConfigError, match="cannot read device plugin config"):
        load_config(tmp_path / "missing.json")


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)
