"""Plans (deviceplugin/provision/plan.py): the writes that reach a PF's desired config and the
existing VFs they touch; and the device plugin resources the merged configs make (pools.py)."""

from __future__ import annotations

from deviceplugin.config import DevicePluginConfig
from deviceplugin.provision.crs import PfConfig, VfGroup
from deviceplugin.provision.holders import Holder
from deviceplugin.provision.merge import merge
from deviceplugin.provision.plan import plan
from deviceplugin.provision.pools import resources
from deviceplugin.provision.record import PfRecord
from deviceplugin.selectors import build_pools
from deviceplugin.sysfs import discover
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs
from tests.unit.deviceplugin.provision_helpers import pf, policy, vf

PCI = "0000:3b:00.0"


def config(num_vfs: int = 4, mtu: int = 0, external: bool = False, **groups: str) -> PfConfig:
    """A PF config whose groups are given as resource=("netdevice"|"vfio-pci")@first-last."""
    return pf_config(groups, num_vfs, mtu, external)


def pf_config(
    groups: dict[str, str], num_vfs: int = 4, mtu: int = 0, external: bool = False
) -> PfConfig:
    made = []
    for name, spec in groups.items():
        device_type, _, rng = spec.partition("@")
        first, last = map(int, rng.split("-"))
        made.append(
            VfGroup(
                resource_name=name,
                device_type=device_type,
                first=first,
                last=last,
                policy_name=name,
                mtu=mtu,
            )
        )
    return PfConfig(
        pci_address=PCI,
        name="ens1f0",
        num_vfs=num_vfs,
        mtu=mtu,
        externally_managed=external,
        vf_groups=tuple(made),
    )


def test_vfs_are_created_on_a_pf_without_any_and_that_touches_nothing() -> None:
    (p,) = plan([config(a="netdevice@0-3")], [pf(PCI, "ens1f0")], {}).pfs
    assert (p.num_vfs, p.binds, p.touched) == (4, (), frozenset())


def test_a_numvfs_change_touches_every_existing_vf() -> None:
    parent = pf(PCI, "ens1f0", numvfs=2)
    vfs = [vf(parent, i) for i in range(2)]
    (p,) = plan([config(num_vfs=4, a="netdevice@0-3")], [parent, *vfs], {}).pfs
    assert p.num_vfs == 4
    assert p.touched == {v.address for v in vfs}


def test_a_driver_change_touches_only_the_vfs_it_rebinds() -> None:
    parent = pf(PCI, "ens1f0", numvfs=4)
    vfs = [vf(parent, i) for i in range(3)] + [vf(parent, 3, driver="vfio-pci")]
    desired = config(a="netdevice@0-1", b="vfio-pci@2-2", c="netdevice@3-3")
    (p,) = plan([desired], [parent, *vfs], {}).pfs
    assert p.num_vfs is None
    assert p.binds == ((vfs[2].address, "vfio-pci"), (vfs[3].address, "netdevice"))
    assert p.touched == {vfs[2].address, vfs[3].address}


def test_mtus_touch_nothing_a_pf_mtu_is_only_raised_and_a_vf_in_a_pod_waits() -> None:
    parent = pf(PCI, "ens1f0", numvfs=2, mtu=1500)
    free = vf(parent, 0)
    in_pod = vf(parent, 1, netdevs=(), mtu=None)  # igbvf holds it, its netdev is elsewhere
    (p,) = plan([config(num_vfs=2, mtu=9000, a="netdevice@0-1")], [parent, free, in_pod], {}).pfs
    assert p.pf_mtu == 9000
    assert p.vf_mtus == ((free.address, "ens1f0v0", 9000),)
    assert p.touched == frozenset()
    high = pf(PCI, "ens1f0", numvfs=2, mtu=9500)
    (p,) = plan([config(num_vfs=2, mtu=9000, a="netdevice@0-1")], [high, free, in_pod], {}).pfs
    assert p.pf_mtu is None  # never lowered


def test_a_matching_pf_needs_no_plan_and_a_down_pf_is_set_up() -> None:
    parent = pf(PCI, "ens1f0", numvfs=2)
    vfs = [vf(parent, i) for i in range(2)]
    assert plan([config(num_vfs=2, a="netdevice@0-1")], [parent, *vfs], {}).pfs == []
    down = pf(PCI, "ens1f0", numvfs=2, admin_up=False)
    (p,) = plan([config(num_vfs=2, a="netdevice@0-1")], [down, *vfs], {}).pfs
    assert p.link_up and p.touched == frozenset()


def test_an_externally_managed_pf_keeps_its_vfs_and_mtu() -> None:
    parent = pf(PCI, "ens1f0", numvfs=6, mtu=1500)
    vfs = [vf(parent, i) for i in range(6)]
    desired = config(num_vfs=4, mtu=9000, external=True, a="vfio-pci@2-3")
    (p,) = plan([desired], [parent, *vfs], {}).pfs
    assert (p.num_vfs, p.pf_mtu) == (None, None)
    assert p.binds == ((vfs[2].address, "vfio-pci"), (vfs[3].address, "vfio-pci"))


def test_removal_resets_only_what_the_record_says_plexus_made() -> None:
    parent = pf(PCI, "ens1f0", numvfs=2, mtu=9000)
    vfs = [vf(parent, i) for i in range(2)]
    applied = config(num_vfs=2, mtu=9000, a="netdevice@0-1")
    made = PfRecord(pci_address=PCI, created_vfs=True, original_mtu=1500, config=applied)
    (p,) = plan([], [parent, *vfs], {PCI: made}).pfs
    assert (p.desired, p.num_vfs, p.pf_mtu) == (None, 0, 1500)
    assert p.touched == {v.address for v in vfs}
    external = PfRecord(pci_address=PCI, externally_managed=True, config=applied)
    plans = plan([], [parent, *vfs], {PCI: external})
    assert (plans.pfs, plans.forget) == ([], [PCI])
    assert plan([], [parent, *vfs], {}).pfs == []  # no record: not Plexus's to reset


def test_pools_hold_exactly_each_groups_configured_vfs() -> None:
    parent = pf(PCI, "ens1f0", numvfs=6)
    vfs = [vf(parent, i) for i in range(5)] + [vf(parent, 5, driver="vfio-pci")]
    desired = merge(
        [
            policy("a-net", nicSelector={"pfNames": ["ens1f0#0-1"]}, numVfs=6, linkType="eth"),
            policy(
                "b-dpdk",
                nicSelector={"pfNames": ["ens1f0#4-5"]},
                numVfs=6,
                deviceType="vfio-pci",
                linkType="eth",
                needVhostNet=True,
            ),
        ],
        [parent],
    )
    made = resources(desired, [parent, *vfs])
    assert [r.full_name for r in made] == ["openshift.io/a_net", "openshift.io/b_dpdk"]
    assert made[0].selectors[0].pci_addresses == [vfs[0].address, vfs[1].address]
    assert made[0].selectors[0].link_types == ["ether"]
    # VF 4 still has igbvf: not offered as a vfio-pci VF until it is rebound.
    assert made[1].selectors[0].pci_addresses == [vfs[5].address]
    assert made[1].selectors[0].link_types == []  # a vfio-pci VF has no netdev to read it
    assert made[1].selectors[0].need_vhost_net
    pools = build_pools(DevicePluginConfig(resource_list=made), [parent, *vfs])
    assert [d.vf_index for d in pools["openshift.io/a_net"]] == [0, 1]
    assert [d.vf_index for d in pools["openshift.io/b_dpdk"]] == [5]


def test_a_vf_held_under_another_resource_waits_to_join_its_new_pool() -> None:
    parent = pf(PCI, "ens1f0", numvfs=2)
    vfs = [vf(parent, i) for i in range(2)]
    held = {
        vfs[0].address: {Holder("openshift.io/old", "ns", "p")},
        vfs[1].address: {Holder("openshift.io/new", "ns", "q")},
    }
    (made,) = resources([pf_config({"new": "netdevice@0-1"}, num_vfs=2)], [parent, *vfs], held)
    assert made.selectors[0].pci_addresses == [vfs[1].address]
    assert resources([pf_config({"x": "vfio-pci@0-1"}, num_vfs=2)], [parent, *vfs]) == []


def test_a_resource_name_with_dashes_is_a_valid_pool() -> None:
    parent = pf(PCI, "ens1f0", numvfs=1)
    (made,) = resources(
        [pf_config({"net-device-1": "netdevice@0-0"}, num_vfs=1)],
        [parent, vf(parent, 0)],
        prefix="example.com",
    )
    assert made.full_name == "example.com/net-device-1"


def test_discovery_reads_the_netdev_settings_plans_compare(fake_sysfs: FakeSysfs) -> None:
    fake_sysfs.add_pf(PCI, "ens1f0", mtu=9000, mac="52:54:00:12:34:56", flags=0x1003)
    fake_sysfs.add_vf(PCI, 0, "0000:3b:02.0", netdev="ens1f0v0", mtu=1500, flags=0x1002)
    parent, child = discover(fake_sysfs.root)
    assert (parent.mac, parent.mtu, parent.admin_up) == ("52:54:00:12:34:56", 9000, True)
    assert (child.mtu, child.admin_up, child.speed) == (1500, False, None)
