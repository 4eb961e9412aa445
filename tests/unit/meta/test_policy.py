"""What a tenant's config may name on the host: paths, the meta-plugin itself, devices."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cni.errors import CNIError, ErrorCode
from meta.install import IDENTITY, is_own_executable
from meta.policy import (
    HostPathPolicy,
    device_id_problem,
    path_values,
    refuse_plexus,
    refuse_plexus_delegates,
)


def _ipam(**keys: Any) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "ipam": keys}


@pytest.fixture
def policy(tmp_path: Path) -> HostPathPolicy:
    (tmp_path / "allowed" / "net").mkdir(parents=True)
    return HostPathPolicy([str(tmp_path / "allowed")])


@pytest.mark.parametrize(
    ("config", "key"),
    [
        (_ipam(type="host-local", dataDir="/"), "macvlan ipam.dataDir"),
        (_ipam(type="host-local", resolvConf="/etc/shadow"), "macvlan ipam.resolvConf"),
        (_ipam(type="dhcp", daemonSocketPath="/run/containerd/containerd.sock"), "ipam.daemon"),
        (
            _ipam(type="whereabouts", kubernetes={"kubeconfig": "/etc/kubernetes/admin.conf"}),
            "kubeconfig",
        ),
        (_ipam(type="whereabouts", log_file="/etc/cron.d/x"), "ipam.log_file"),
        (_ipam(type="whereabouts", configuration_path="/root/x"), "configuration_path"),
        ({"name": "n", "type": "sriov", "dataDir": "/etc"}, "sriov dataDir"),
        ({"name": "n", "type": "sriov", "logFile": "/etc/passwd"}, "sriov logFile"),
        ({"name": "n", "plugins": [{"type": "tuning", "dataDir": "/boot"}]}, "tuning dataDir"),
    ],
)
def test_a_host_path_outside_the_allowed_roots_is_refused_naming_the_key(
    policy: HostPathPolicy, config: dict[str, Any], key: str
) -> None:
    with pytest.raises(CNIError) as caught:
        policy.check(config, "tenant/evil")
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert key in caught.value.msg and "tenant/evil" in caught.value.msg
    assert "allowedHostPaths" in caught.value.details


def test_paths_that_escape_by_dots_slashes_or_symlinks_are_refused(
    policy: HostPathPolicy, tmp_path: Path
) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "out").symlink_to("/etc")
    for path in (
        f"{allowed}/../etc",
        f"{allowed}/./net",
        f"{allowed}//net",
        f"{allowed}/out/cron.d",
        "relative/dir",
        f"{allowed}suffix",  # a sibling whose name starts like the root
        f"{allowed}/net\0x",
    ):
        assert policy.problem(path), path
    assert policy.problem(42) == "it is not a string"


def test_paths_under_an_allowed_root_pass(policy: HostPathPolicy, tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    for path in (str(allowed), f"{allowed}/net", f"{allowed}/net/", f"{allowed}/not-yet/there"):
        assert policy.problem(path) == "", path
    policy.check(_ipam(type="host-local", dataDir=f"{allowed}/net"), "ok")


def test_paths_are_judged_inside_chroot_dir(tmp_path: Path) -> None:
    """A daemon in a container sees the host's / at chrootDir: the allowed roots and the
    symlinks are the host's."""
    host = tmp_path / "hostroot"
    (host / "var/lib/cni").mkdir(parents=True)
    (host / "var/lib/cni/escape").symlink_to("/etc")  # absolute: the host's /etc
    policy = HostPathPolicy(["/var/lib/cni"], str(host))
    assert policy.problem("/var/lib/cni/networks") == ""
    assert policy.problem("/var/lib/cni/escape") != ""
    assert policy.problem("/etc") != ""


def test_path_values_finds_every_known_key_in_confs_and_conflists() -> None:
    conflist = {
        "name": "n",
        "plugins": [
            {"type": "sriov", "dataDir": "/a", "ipam": {"type": "host-local", "dataDir": "/b"}},
            {"type": "tuning", "dataDir": "/c"},
        ],
    }
    assert [value for _, value in path_values(conflist)] == ["/a", "/b", "/c"]
    assert list(path_values({"name": "n", "type": "bridge"})) == []


def test_the_meta_plugin_is_recognised_by_its_contents_under_any_name(tmp_path: Path) -> None:
    shim = tmp_path / "innocent-name"
    shim.write_bytes(b"\x7fELF" + os.urandom(3 << 20) + IDENTITY + b"tail")
    plain = tmp_path / "bridge"
    plain.write_bytes(b"\x7fELF" + os.urandom(1 << 20))
    split = tmp_path / "split"  # the marker across the 1 MiB read boundary
    split.write_bytes(b"x" * ((1 << 20) - 5) + IDENTITY)

    assert is_own_executable(str(shim)) and is_own_executable(str(split))
    assert not is_own_executable(str(plain))
    assert not is_own_executable(str(tmp_path / "missing"))
    with pytest.raises(CNIError) as caught:
        refuse_plexus("innocent-name", str(shim))
    assert caught.value.code == ErrorCode.INVALID_CONFIG and "Plexus itself" in caught.value.msg
    refuse_plexus("bridge", str(plain))


def test_a_chain_or_ipam_that_names_the_meta_plugin_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    (tmp_path / "macvlan").write_bytes(b"plain")
    (tmp_path / "renamed").write_bytes(b"#!/bin/sh\n# " + IDENTITY + b"\n")
    (tmp_path / "linked").symlink_to(tmp_path / "renamed")
    for name in ("macvlan", "renamed"):
        (tmp_path / name).chmod(0o755)
    paths = [str(tmp_path)]
    refuse_plexus_delegates([{"name": "n", "type": "macvlan", "ipam": {"type": "nope"}}], paths)
    for config in (
        {"name": "n", "plugins": [{"type": "macvlan"}, {"type": "renamed"}]},
        {"name": "n", "type": "macvlan", "ipam": {"type": "linked"}},
    ):
        with pytest.raises(CNIError, match="is Plexus itself"):
            refuse_plexus_delegates([config], paths)


@pytest.mark.parametrize(
    ("device_id", "ok"),
    [
        ("0000:3b:02.1", True),
        ("mlx5_0", True),
        ("vdpa:1", True),
        ("../../etc/passwd", False),
        ("/dev/vfio/7", False),
        ("a..b", False),
        ("", False),
        ("x" * 129, False),
        ("dev id", False),
    ],
)
def test_device_ids_are_pci_addresses_or_opaque_ids_without_path_characters(
    device_id: str, ok: bool
) -> None:
    assert (device_id_problem(device_id) == "") is ok
