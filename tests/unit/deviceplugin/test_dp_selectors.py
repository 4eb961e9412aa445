"""Selectors and resource pools over a FAKE sysfs tree, and `plexus deviceplugin list`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.config import DevicePluginConfig, parse_config
from deviceplugin.selectors import build_pools, healthy, offerable, selector_matches
from deviceplugin.sysfs import PciNetDevice, discover
from meta.cli import main
from tests.unit.deviceplugin.fake_sysfs import INFINIBAND, FakeSysfs

PF0 = "0000:3b:00.0"  # ens1f0: 4 iavf VFs, 0000:3b:02.0-3
PF1 = "0000:3b:00.1"  # ens1f1: 2 VFs, VF 0 on vfio-pci
MLX = "0000:5e:00.0"  # mlx5 PF, RDMA, no VFs
IB = "0000:5e:00.1"  # infiniband PF, no VFs
MGMT = "0000:01:00.0"  # eno1: carries the default route
VF = [f"0000:3b:02.{i}" for i in range(4)]
VF1 = ["0000:3b:0a.0", "0000:3b:0a.1"]


@pytest.fixture
def host(fake_sysfs: FakeSysfs) -> list[PciNetDevice]:
    """A fake host: two Intel PFs with VFs, Mellanox ports, a management NIC."""
    fake_sysfs.add_pf(PF0, "ens1f0", acpi_index=1, iommu_group=10)
    for i, addr in enumerate(VF):
        fake_sysfs.add_vf(PF0, i, addr, netdev=f"ens1f0v{i}", operstate="down")
    fake_sysfs.add_pf(PF1, "ens1f1", acpi_index=2, numa_node=1, operstate="down")
    fake_sysfs.add_vf(PF1, 0, VF1[0], driver="vfio-pci", numa_node=1, iommu_group=20)
    fake_sysfs.add_vf(PF1, 1, VF1[1], netdev="ens1f1v1", numa_node=1)
    fake_sysfs.add_pf(
        MLX, "enp94s0f0", vendor="15b3", device="1017", driver="mlx5_core", rdma="mlx5_0"
    )
    fake_sysfs.add_device(
        IB, vendor="15b3", device="1017", driver="mlx5_core", netdev="ib0", link_type=INFINIBAND
    )
    fake_sysfs.add_device(MGMT, device="1533", driver="igb", netdev="eno1", acpi_index=7)
    return discover(fake_sysfs.root, {"eno1"})


def config(*selector_lists: list[dict[str, Any]] | dict[str, Any]) -> DevicePluginConfig:
    resources = [
        {"resourceName": f"r{i}", "selectors": sels} for i, sels in enumerate(selector_lists)
    ]
    return parse_config(json.dumps({"resourceList": resources}))


def pool(host: list[PciNetDevice], *selectors: dict[str, Any]) -> list[str]:
    """Addresses one resource with these selector objects gets."""
    return [d.address for d in build_pools(config(list(selectors)), host)["intel.com/r0"]]


OFFERED = [*VF, *VF1, MLX, IB]  # everything except PFs with VFs and eno1


def test_exclusions(host: list[PciNetDevice]) -> None:
    by = {d.address: d for d in host}
    assert not offerable(by[PF0]) and not offerable(by[PF1])  # VFs enabled
    assert not offerable(by[MGMT])  # default route
    assert offerable(by[MLX]) and offerable(by[VF[0]])
    assert sorted(pool(host, {})) == sorted(OFFERED)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({"vendors": ["15b3"]}, [MLX, IB]),
        ({"vendors": ["8086"]}, [*VF, *VF1]),
        ({"devices": ["154c"]}, [*VF, *VF1]),
        ({"devices": ["1017", "154C"]}, [*VF, *VF1, MLX, IB]),
        ({"drivers": ["vfio-pci"]}, [VF1[0]]),
        ({"drivers": ["iavf", "mlx5_core"]}, [*VF, VF1[1], MLX, IB]),
        ({"pciAddresses": [VF[2], "0000:5E:00.0"]}, [VF[2], MLX]),
        ({"acpiIndexes": ["1"]}, []),  # only the PF has it, and it has VFs
        ({"acpiIndexes": ["7"]}, []),  # eno1 has the default route
        ({"pfNames": ["ens1f0"]}, VF),
        ({"pfNames": ["ens1f0#1-2"]}, [VF[1], VF[2]]),
        ({"pfNames": ["ens1f0#0,3", "ens1f1#1"]}, [VF[0], VF[3], VF1[1]]),
        ({"pfNames": ["enp94s0f0"]}, [MLX]),  # a PF without VFs matches its own name
        ({"pfNames": ["enp94s0f0#0"]}, []),
        ({"rootDevices": [PF1]}, VF1),
        ({"rootDevices": [f"{PF0}#2-3"]}, [VF[2], VF[3]]),
        ({"linkTypes": ["infiniband"]}, [IB]),
        ({"linkTypes": ["ether"]}, [*VF, VF1[1], MLX]),  # the vfio VF has no netdev
        ({"isRdma": True}, [MLX]),
        ({"isRdma": False}, OFFERED),
        ({"needVhostNet": True}, OFFERED),  # not a filter: asks for /dev/vhost-net
        ({"vdpaType": "vhost"}, []),
    ],
)
def test_each_selector(
    host: list[PciNetDevice], selector: dict[str, Any], expected: list[str]
) -> None:
    assert sorted(pool(host, selector)) == sorted(expected)


def test_vdpa_selector(fake_sysfs: FakeSysfs) -> None:
    fake_sysfs.add_device("0000:09:00.0", netdev="v0", vdpa_driver="vhost_vdpa")
    fake_sysfs.add_device("0000:09:00.1", netdev="v1", vdpa_driver="virtio_vdpa")
    fake_sysfs.add_device("0000:09:00.2", netdev="v2")
    devices = discover(fake_sysfs.root)
    assert pool(devices, {"vdpaType": "virtio"}) == ["0000:09:00.1"]
    assert pool(devices, {"vdpaType": "vhost"}) == ["0000:09:00.0"]


def test_and_within_a_selector(host: list[PciNetDevice]) -> None:
    assert pool(host, {"vendors": ["8086"], "drivers": ["iavf"], "pfNames": ["ens1f1"]}) == [VF1[1]]
    assert pool(host, {"vendors": ["15b3"], "drivers": ["iavf"]}) == []


def test_or_across_selectors(host: list[PciNetDevice]) -> None:
    got = pool(host, {"drivers": ["vfio-pci"]}, {"isRdma": True}, {"pfNames": ["ens1f0#3"]})
    assert sorted(got) == sorted([VF1[0], MLX, VF[3]])


def test_first_matching_resource_wins(host: list[PciNetDevice]) -> None:
    conf = config(
        [{"pfNames": ["ens1f0#0-1"]}],
        {"vendors": ["8086"]},  # single object, old style
        [{"drivers": ["iavf"]}, {"vendors": ["15b3"]}],
        [{"linkTypes": ["infiniband"]}],
    )
    pools = {k: [d.address for d in v] for k, v in build_pools(conf, host).items()}
    assert pools == {
        "intel.com/r0": [VF[0], VF[1]],
        "intel.com/r1": [VF[2], VF[3], *VF1],
        "intel.com/r2": [MLX, IB],
        "intel.com/r3": [],  # IB went to r2 first
    }


def test_selector_matches_directly(host: list[PciNetDevice]) -> None:
    by = {d.address: d for d in host}
    (sel,) = config({"pfNames": ["ens1f0"]}).resource_list[0].selectors
    # selector_matches alone does not apply the exclusions: the PF's own name matches.
    assert selector_matches(sel, by[PF0])
    assert selector_matches(sel, by[VF[0]])
    assert not selector_matches(sel, by[VF1[0]])


def test_health(host: list[PciNetDevice]) -> None:
    by = {d.address: d for d in host}
    assert healthy(by[VF[0]], by)  # own link down, but its PF is up
    assert not healthy(by[VF1[1]], by)  # PF ens1f1 is down
    assert not healthy(by[VF1[0]], by)  # no netdev, follows the PF too
    assert healthy(by[MLX], by)


def write_config(tmp_path: Path, resources: list[dict[str, Any]]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"resourceList": resources}))
    return str(path)


def test_cli_list(
    host: list[PciNetDevice],
    fake_sysfs: FakeSysfs,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conf = write_config(
        tmp_path,
        [
            {"resourceName": "vfio", "selectors": [{"drivers": ["vfio-pci"]}]},
            {
                "resourceName": "intel_vf",
                "resourcePrefix": "example.com",
                "selectors": {"vendors": ["8086"], "pfNames": ["ens1f1"]},
            },
            {"resourceName": "none", "selectors": [{"vendors": ["1af4"]}]},
        ],
    )
    with pytest.raises(SystemExit) as exit_:
        main(["deviceplugin", "list", "--config", conf, "--sysfs-root", str(fake_sysfs.root)])
    assert exit_.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "intel.com/vfio": [
            {"id": VF1[0], "pf": "ens1f1", "driver": "vfio-pci", "numa": 1, "healthy": False}
        ],
        "example.com/intel_vf": [
            {"id": VF1[1], "pf": "ens1f1", "driver": "iavf", "numa": 1, "healthy": False}
        ],
        "intel.com/none": [],
    }


def test_cli_list_pf_entry(
    host: list[PciNetDevice],
    fake_sysfs: FakeSysfs,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    conf = write_config(tmp_path, [{"resourceName": "rdma", "selectors": [{"isRdma": True}]}])
    with pytest.raises(SystemExit):
        main(["deviceplugin", "list", "--config", conf, "--sysfs-root", str(fake_sysfs.root)])
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "intel.com/rdma": [
            {"id": MLX, "pf": "enp94s0f0", "driver": "mlx5_core", "numa": 0, "healthy": True}
        ]
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"resourceList": [{"resourceName": "a", "selectors": [{"pfNames": ["p#x"]}]}]}',
            "resourceList[0].selectors[0].pfNames: 'p#x': bad VF range",
        ),
        ("not json", "device plugin config: invalid JSON"),
    ],
)
def test_cli_config_error_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        main(["deviceplugin", "list", "--config", str(path), "--sysfs-root", str(tmp_path)])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("plexus deviceplugin: invalid") or "invalid JSON" in captured.err
    assert message in captured.err
    assert "Traceback" not in captured.err and captured.err.count("\n") == 1


def test_cli_missing_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["deviceplugin", "list", "--config", str(tmp_path / "nope.json")])
    assert exit_.value.code == 2
    assert "cannot read device plugin config" in capsys.readouterr().err
