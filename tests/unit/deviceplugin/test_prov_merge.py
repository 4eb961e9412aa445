"""Policies merged into PF configs as the operator merges them, and the webhook checks the
node makes instead (deviceplugin/provision/merge.py)."""

from __future__ import annotations

import pytest

from deviceplugin.provision.crs import CRError, NodePolicy, PfConfig
from deviceplugin.provision.merge import Partition, admit, merge, sriov_pfs
from tests.unit.deviceplugin.provision_helpers import pf, policy, vf

PF0 = pf("0000:3b:00.0", "ens1f0")
PF1 = pf("0000:3b:00.1", "ens1f1", vendor="15b3", device="1017")
PFS = [PF0, PF1]


def groups(config_list: list[PfConfig], pci: str = PF0.address) -> list[tuple[str, str]]:
    (config,) = [c for c in config_list if c.pci_address == pci]
    return [(g.resource_name, g.vf_range) for g in config.vf_groups]


def test_one_policy_takes_every_vf_of_the_pfs_it_selects() -> None:
    (config,) = merge([policy("a", nicSelector={"pfNames": ["ens1f0"]}, mtu=9000)], PFS)
    assert (config.pci_address, config.name, config.num_vfs, config.mtu) == (
        PF0.address,
        "ens1f0",
        4,
        9000,
    )
    assert groups([config]) == [("a", "0-3")]


def test_vendor_device_and_root_device_selectors() -> None:
    assert [c.pci_address for c in merge([policy("a", nicSelector={"vendor": "15B3"})], PFS)] == [
        PF1.address
    ]
    by_id = policy("b", nicSelector={"vendor": "8086", "deviceID": "10c9"})
    assert [c.pci_address for c in merge([by_id], PFS)] == [PF0.address]
    by_root = policy("c", nicSelector={"rootDevices": [PF1.address]})
    assert [c.pci_address for c in merge([by_root], PFS)] == [PF1.address]
    both = policy("d", nicSelector={"vendor": "8086", "rootDevices": [PF1.address]})
    assert merge([both], PFS) == []  # every field given must match


def test_partitions_of_equal_priority_share_the_pf_with_the_larger_mtu_and_numvfs() -> None:
    a = policy("a", nicSelector={"pfNames": ["ens1f0#0-1"]}, numVfs=4, mtu=1500, priority=10)
    b = policy("b", nicSelector={"pfNames": ["ens1f0#2-5"]}, numVfs=6, mtu=9000, priority=10)
    (config,) = merge([a, b], PFS)
    assert groups([config]) == [("b", "2-5"), ("a", "0-1")]
    assert (config.num_vfs, config.mtu) == (6, 9000)


def test_partitions_of_different_priority_both_stay_and_the_pf_takes_the_max() -> None:
    low = policy("low", nicSelector={"pfNames": ["ens1f0#0-1"]}, numVfs=8, mtu=9000, priority=50)
    high = policy("high", nicSelector={"pfNames": ["ens1f0#2-3"]}, numVfs=4, priority=1)
    (config,) = merge([high, low], PFS)
    assert groups([config]) == [("high", "2-3"), ("low", "0-1")]
    assert (config.num_vfs, config.mtu) == (8, 9000)


def test_priority_zero_wins_and_replaces_the_whole_pf() -> None:
    # Sorted 99 first, 0 last: the last applied wins. Overlapping ranges do not merge, and
    # with different priorities the PF's MTU and numVfs are the winner's alone.
    low = policy("low", nicSelector={"pfNames": ["ens1f0"]}, numVfs=8, mtu=9000, priority=99)
    high = policy("high", nicSelector={"pfNames": ["ens1f0#0-1"]}, numVfs=2, priority=0)
    (config,) = merge([high, low], PFS)
    assert groups([config]) == [("high", "0-1")]
    assert (config.num_vfs, config.mtu) == (2, 0)
    unset = policy("unset", nicSelector={"pfNames": ["ens1f0"]}, numVfs=3)  # priority 0
    assert merge([unset, low], PFS)[0].num_vfs == 3


def test_the_same_resource_name_replaces_the_older_group() -> None:
    a = policy("a", nicSelector={"pfNames": ["ens1f0#0-1"]}, resourceName="r", priority=5)
    b = policy("b", nicSelector={"pfNames": ["ens1f0#2-3"]}, resourceName="r", priority=5)
    (config,) = merge([a, b], PFS)
    assert groups([config]) == [("r", "2-3")]


def test_policies_that_select_nothing_here_are_left_out() -> None:
    other_node = policy("a", nicSelector={"pfNames": ["ens1f0"]}, nodeSelector={"role": "x"})
    zero = policy("b", nicSelector={"pfNames": ["ens1f0"]}, numVfs=0)
    default = policy("default", nicSelector={"pfNames": ["ens1f0"]})
    admitted = admit([other_node, zero, default], {"role": "y"}, PFS).admitted
    assert [p.name for p in admitted] == ["b"]
    assert merge(admitted, PFS) == []  # numVfs 0 configures nothing


def test_admit_refuses_numvfs_over_totalvfs() -> None:
    big = policy("big", nicSelector={"pfNames": ["ens1f0"]}, numVfs=9)
    result = admit([big], {}, PFS)
    assert result.admitted == []
    assert result.rejected == {
        "big": "numVfs(9) exceeds the maximum allowed value(8) of interface ens1f0"
    }


def test_admit_refuses_the_later_of_two_overlapping_partitions() -> None:
    first = policy("first", "2026-01-01T00:00:00Z", nicSelector={"pfNames": ["ens1f0#0-2"]})
    later = policy("later", "2026-01-02T00:00:00Z", nicSelector={"pfNames": ["ens1f0#2-3"]})
    result = admit([later, first], {}, PFS)
    assert [p.name for p in result.admitted] == ["first"]
    assert result.rejected == {
        "later": "VF index range in ens1f0#2-3 is overlapped with existing policy first"
    }
    apart = policy("apart", "2026-01-03T00:00:00Z", nicSelector={"pfNames": ["ens1f0#3-3"]})
    assert [p.name for p in admit([first, apart], {}, PFS).admitted] == ["first", "apart"]


def test_admit_checks_externally_managed_pfs_against_what_exists() -> None:
    made = pf("0000:3b:00.0", "ens1f0", numvfs=2, mtu=1500)
    many = policy("many", nicSelector={"pfNames": ["ens1f0"]}, numVfs=4, externallyManaged=True)
    big_mtu = policy(
        "mtu", nicSelector={"pfNames": ["ens1f0"]}, numVfs=2, mtu=9000, externallyManaged=True
    )
    fits = policy("fits", nicSelector={"pfNames": ["ens1f0"]}, numVfs=2, externallyManaged=True)
    result = admit([many, big_mtu, fits], {}, [made])
    assert [p.name for p in result.admitted] == ["fits"]
    assert result.rejected == {
        "many": "numVfs(4) is higher than the VFs created externally on ens1f0 (2)",
        "mtu": "MTU(9000) is higher than the MTU of the externally managed PF ens1f0 (1500)",
    }


def test_admit_refuses_mixed_external_management_and_topology_on_shared_things() -> None:
    mine = policy("mine", "2026-01-01T00:00:00Z", nicSelector={"pfNames": ["ens1f0#0-1"]})
    ext = policy(
        "ext",
        "2026-01-02T00:00:00Z",
        nicSelector={"pfNames": ["ens1f0#2-3"]},
        externallyManaged=True,
    )
    topo = policy(
        "topo",
        "2026-01-03T00:00:00Z",
        nicSelector={"pfNames": ["ens1f1"]},
        resourceName="mine",
        excludeTopology=True,
    )
    made = [pf("0000:3b:00.0", "ens1f0", numvfs=4), PF1]
    assert admit([mine, ext, topo], {}, made).rejected == {
        "ext": "externallyManaged is inconsistent with existing policy mine",
        "topo": "excludeTopology[true] conflicts with policy mine for the same resource mine",
    }


def test_vfs_and_plain_nics_are_not_sriov_pfs() -> None:
    plain = pf("0000:00:03.0", "eth0", total=0)
    assert sriov_pfs([PF0, vf(PF0, 0), plain]) == [PF0]


def test_partition_parsing() -> None:
    assert Partition.parse("ens1f0#2-5") == Partition("ens1f0", 2, 5)
    assert Partition.parse("ens1f0") == Partition("ens1f0")
    for bad in ("ens1f0#2", "ens1f0#a-3", "ens1f0#1-2#3"):
        with pytest.raises(ValueError):
            Partition.parse(bad)


def test_a_policy_that_does_not_parse_is_an_error_naming_it() -> None:
    with pytest.raises(CRError, match=r"SriovNetworkNodePolicy ns/bad: spec\.numVfs"):
        NodePolicy.from_api(
            {
                "kind": "SriovNetworkNodePolicy",
                "metadata": {"name": "bad", "namespace": "ns"},
                "spec": {"resourceName": "r", "numVfs": "many", "nicSelector": {}},
            }
        )
