"""A claim's opaque configuration for sriov.plexus.io (deviceplugin/dra/params.py)."""

from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.config import ConfigError
from deviceplugin.dra.params import request_parameters

DRIVER = "sriov.plexus.io"


def entry(params: Any, *, requests: list[str] | None = None, source: str = "FromClaim",
          driver: str = DRIVER) -> dict[str, Any]:  # fmt: skip
    return {
        "source": source,
        "requests": requests or [],
        "opaque": {"driver": driver, "parameters": params},
    }


def test_no_config_keeps_the_driver() -> None:
    assert request_parameters([], "vf").driver is None


def test_the_claim_overrides_the_class_whatever_the_order() -> None:
    configs = [entry({"driver": "vfio-pci"}), entry({"driver": "netdevice"}, source="FromClass")]
    assert request_parameters(configs, "vf").driver == "vfio-pci"


def test_entries_for_other_requests_and_drivers_do_not_apply() -> None:
    configs = [
        entry({"driver": "vfio-pci"}, requests=["other"]),
        entry({"whatever": 1}, driver="gpu.example.com"),
        entry({"driver": "igb_uio"}, requests=["vf"]),
    ]
    assert request_parameters(configs, "vf").driver == "igb_uio"
    assert request_parameters(configs, "other").driver == "vfio-pci"
    # A subrequest of a prioritized list takes its parent request's config.
    assert request_parameters(configs, "vf/fast").driver == "igb_uio"


def test_bad_parameters_name_the_entry_and_field() -> None:
    with pytest.raises(ConfigError, match=r"config\[1\]\.opaque\.parameters: driver: Input"):
        request_parameters([entry({}), entry({"driver": "e1000"})], "vf")
    with pytest.raises(ConfigError, match=r"config\[0\]\.opaque\.parameters: mtu: Extra"):
        request_parameters([entry({"mtu": 9000})], "vf")
    with pytest.raises(ConfigError, match=r"config\[0\]\.opaque\.parameters: must be a JSON"):
        request_parameters([entry(["vfio-pci"])], "vf")
