"""The daemon's own config decides every key a runtime does not supply."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cni.errors import CNIError, ErrorCode
from meta.authority import RUNTIME_KEYS, call_config
from meta.config import MetaConfig
from meta.daemon.config import DaemonConfig

BRIDGE = {"cniVersion": "1.0.0", "name": "default", "type": "bridge"}
DAEMON = DaemonConfig.model_validate(
    {
        "cniVersion": "1.0.0",
        "name": "plexus-cni-network",
        "type": "plexus",
        "delegates": [BRIDGE],
        "chrootDir": "/hostroot",
        "cniDir": "/var/lib/cni/plexus",
        "socketDir": "/run/plexus",
    }
)


def _call(**keys: Any) -> bytes:
    return json.dumps(
        {"cniVersion": "1.1.0", "name": "plexus-cni-network", "type": "plexus", **keys}
    ).encode()


def test_the_runtime_keys_come_from_the_call_the_rest_from_the_daemon() -> None:
    conf = call_config(
        DAEMON,
        _call(
            runtimeConfig={"portMappings": [{"hostPort": 80}]},
            **{"cni.dev/valid-attachments": [{"containerID": "c", "ifname": "eth0"}]},
        ),
    )
    assert conf.cni_version == "1.1.0"
    assert conf.runtime_config == {"portMappings": [{"hostPort": 80}]}
    assert conf.model_extra == {
        "cni.dev/valid-attachments": [{"containerID": "c", "ifname": "eth0"}]
    }
    assert conf.delegates == [BRIDGE] and conf.chroot_dir == "/hostroot"
    assert DAEMON.cni_version == "1.0.0"  # the daemon's own config is untouched


def test_a_call_that_repeats_the_daemons_values_is_served() -> None:
    stdin = _call(delegates=[BRIDGE], chrootDir="/hostroot", socketDir="/run/plexus")
    assert call_config(DAEMON, stdin).delegates == [BRIDGE]


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"chrootDir": "/tmp/evil"}, "chrootDir"),
        ({"binDir": "/tmp/evil/bin"}, "binDir"),
        ({"cniDir": "/etc"}, "cniDir"),
        ({"confDir": "/root"}, "confDir"),
        ({"logFile": "/etc/passwd"}, "logFile"),
        ({"kubeconfig": "/etc/kubernetes/admin.conf"}, "kubeconfig"),
        ({"delegates": [{"name": "x", "type": "plexus"}]}, "delegates"),
        ({"clusterNetwork": "evil/net"}, "clusterNetwork"),
        ({"execDelegates": ["macvlan"]}, "execDelegates"),
        ({"allowedHostPaths": ["/"]}, "allowedHostPaths"),
        ({"socketDir": "/tmp/other"}, "socketDir"),
        ({"chrootDir": "/a", "binDir": "/b"}, "binDir, chrootDir"),
    ],
)
def test_a_call_that_overrides_a_privileged_key_is_refused(
    keys: dict[str, Any], named: str
) -> None:
    with pytest.raises(CNIError) as caught:
        call_config(DAEMON, _call(**keys))
    assert caught.value.code == ErrorCode.INVALID_CONFIG
    assert f"sets {named} differently" in caught.value.msg


def test_keys_plexus_does_not_know_are_ignored_not_obeyed() -> None:
    conf = call_config(DAEMON, _call(somethingElse="/etc"))
    assert "somethingElse" not in (conf.model_extra or {})


def test_every_meta_config_key_but_the_runtimes_is_decided_by_the_daemon() -> None:
    """A new MetaConfig key is privileged unless added to RUNTIME_KEYS on purpose."""
    runtime = {
        field.alias or name
        for name, field in MetaConfig.model_fields.items()
        if (field.alias or name) in RUNTIME_KEYS
    }
    assert runtime == {"cniVersion", "name", "type", "runtimeConfig", "capabilities"}


def test_a_call_that_is_not_a_json_object_is_a_decode_error() -> None:
    with pytest.raises(CNIError) as caught:
        call_config(DAEMON, b"[1]")
    assert caught.value.code == ErrorCode.DECODE_FAILURE
