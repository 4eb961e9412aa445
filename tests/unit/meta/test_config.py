"""The meta config: Multus keys, defaults and clear errors."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from meta import config
from meta.config import MetaConfig, load_meta_config
from meta.daemon.config import DaemonConfig
from meta.plugin import MetaPlugin


def _conf(**extra: object) -> bytes:
    base: dict[str, object] = {
        "cniVersion": "1.1.0",
        "name": "plexus",
        "type": "plexus",
        "delegates": [{"type": "bridge", "name": "b"}],
    }
    base.update(extra)
    return json.dumps(base).encode()


def test_multus_keys_and_defaults() -> None:
    conf = load_meta_config(
        _conf(
            globalNamespaces="default, infra",
            namespaceIsolation=True,
            readinessindicatorfile="/run/ready",
            multusNamespace="plx",
        )
    )
    assert conf.global_namespaces == ["default", "infra"]
    assert conf.system_namespaces == ["kube-system"]
    assert conf.readiness_indicator_file == "/run/ready"
    assert conf.multus_namespace == "plx"
    assert conf.cni_dir == "/var/lib/cni/plexus"
    assert conf.namespace_allowed("apps", "infra") and not conf.namespace_allowed("apps", "other")


@pytest.mark.parametrize("value", [None, "", " , ", []])
def test_global_namespaces_unset_or_empty_mean_default_as_in_multus(
    value: str | list[str] | None,
) -> None:
    conf = load_meta_config(_conf() if value is None else _conf(globalNamespaces=value))
    assert conf.global_namespaces == ["default"]
    assert conf.max_networks_per_pod == 32


_DELEGATES = [{"type": "bridge", "name": "b"}, {"type": "macvlan", "name": "m"}]

# Every key the meta config accepts, set to a value that is not its default, and the
# attribute (and parsed value) it must land on.
EVERY_KEY: list[tuple[str, Any, str, Any]] = [
    ("delegates", _DELEGATES, "delegates", _DELEGATES),
    ("clusterNetwork", "default/flannel", "cluster_network", "default/flannel"),
    (
        "defaultNetworks",
        ["sidecar", "infra/monitor"],
        "default_networks",
        ["sidecar", "infra/monitor"],
    ),
    ("systemNamespaces", "kube-system, ops", "system_namespaces", ["kube-system", "ops"]),
    ("systemNamespaces", ["ops"], "system_namespaces", ["ops"]),
    ("multusNamespace", "plexus-system", "multus_namespace", "plexus-system"),
    ("namespaceIsolation", True, "namespace_isolation", True),
    ("globalNamespaces", "infra,ops", "global_namespaces", ["infra", "ops"]),
    ("globalNamespaces", ["infra", "default"], "global_namespaces", ["infra", "default"]),
    ("maxNetworksPerPod", 4, "max_networks_per_pod", 4),
    ("confDir", "/etc/plexus/net.d", "conf_dir", "/etc/plexus/net.d"),
    ("cniDir", "/var/lib/plexus-test", "cni_dir", "/var/lib/plexus-test"),
    ("binDir", "/opt/plexus/bin", "bin_dir", "/opt/plexus/bin"),
    ("chrootDir", "/hostroot", "chroot_dir", "/hostroot"),
    ("readinessindicatorfile", "/run/ready.conf", "readiness_indicator_file", "/run/ready.conf"),
    ("logFile", "/var/log/plexus.log", "log_file", "/var/log/plexus.log"),
    ("logLevel", "DEBUG", "log_level", "debug"),
    ("logToStderr", False, "log_to_stderr", False),
    ("retryDeleteOnError", True, "retry_delete_on_error", True),
    ("delegateTimeoutSeconds", 5, "delegate_timeout", 5.0),
    ("daemonWaitSeconds", 2.5, "daemon_wait", 2.5),
    ("kubeconfig", "/etc/plexus/kubeconfig", "kubeconfig", "/etc/plexus/kubeconfig"),
    ("clusterDir", "/etc/plexus/cluster", "cluster_dir", "/etc/plexus/cluster"),
    ("execDelegates", ["macvlan", "ipvlan"], "exec_delegates", ["macvlan", "ipvlan"]),
    ("podResourcesSocket", "/run/kubelet.sock", "pod_resources_socket", "/run/kubelet.sock"),
    ("deviceCheckpointFile", "/run/checkpoint", "device_checkpoint_file", "/run/checkpoint"),
    ("deviceInfoDir", "/run/devinfo", "device_info_dir", "/run/devinfo"),
    ("apiWriteTimeout", 0.5, "api_write_timeout", 0.5),
    ("allowedHostPaths", ["/srv/cni"], "allowed_host_paths", ["/srv/cni"]),
    ("trustSystemNamespaces", True, "trust_system_namespaces", True),
]


@pytest.mark.parametrize(
    ("key", "value", "attribute", "expected"),
    EVERY_KEY,
    ids=[f"{key}-{type(value).__name__}" for key, value, _, _ in EVERY_KEY],
)
def test_every_key_lands_on_its_attribute(
    key: str, value: Any, attribute: str, expected: Any
) -> None:
    default = getattr(load_meta_config(_conf()), attribute)
    assert default != expected  # the test value really differs from the default
    conf = load_meta_config(_conf(**{key: value}))
    assert getattr(conf, attribute) == expected
    assert not conf.model_extra  # taken as the field, not kept as an unknown key


def test_every_key_at_once() -> None:
    """All keys in one config, each still on its own attribute."""
    values = {key: value for key, value, _, _ in EVERY_KEY}
    conf = load_meta_config(_conf(**values))
    last = {key: (attribute, expected) for key, _, attribute, expected in EVERY_KEY}
    assert {attr: getattr(conf, attr) for attr, _ in last.values()} == dict(last.values())
    accepted = {field.alias or name for name, field in MetaConfig.model_fields.items()}
    # Every accepted key is covered here, except those the runtime sets, not the user.
    assert accepted - set(values) == {"cniVersion", "name", "type", "runtimeConfig", "capabilities"}


# ---- unknown keys -----------------------------------------------------------------


@pytest.fixture
def warned(monkeypatch: pytest.MonkeyPatch) -> set[frozenset[str]]:
    """A fresh memory of the key sets already warned about."""
    fresh: set[frozenset[str]] = set()
    monkeypatch.setattr(config, "_warned", fresh)
    return fresh


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "plexus.config"]


def test_an_unknown_key_is_accepted_and_named_once(
    warned: set[frozenset[str]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="plexus.config"):
        conf = load_meta_config(_conf(clusterNetwrok="flannel"))
        load_meta_config(_conf(clusterNetwrok="flannel"))  # the daemon: every call
    assert conf.model_extra == {"clusterNetwrok": "flannel"}
    assert _warnings(caplog) == ["unknown meta config key 'clusterNetwrok' ignored"]
    (record,) = [r for r in caplog.records if r.name == "plexus.config"]
    assert record.levelno == logging.WARNING and vars(record)["keys"] == ["clusterNetwrok"]


def test_several_unknown_keys_make_one_line_per_distinct_set(
    warned: set[frozenset[str]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="plexus.config"):
        load_meta_config(_conf(logLvel="debug", cniDirr="/x"))
        load_meta_config(_conf(cniDirr="/y", logLvel="info"))
        load_meta_config(_conf(cniDirr="/x"))
    assert _warnings(caplog) == [
        "unknown meta config keys 'cniDirr', 'logLvel' ignored",
        "unknown meta config key 'cniDirr' ignored",
    ]


def test_known_cni_multus_and_daemon_keys_are_not_warned(
    warned: set[frozenset[str]], caplog: pytest.LogCaptureFixture
) -> None:
    known = {
        "args": {"cni": {"ips": ["10.1.0.5"]}},
        "prevResult": {"cniVersion": "1.1.0", "interfaces": []},
        "runtimeConfig": {"portMappings": []},
        "capabilities": {"portMappings": True},
        "cni.dev/valid-attachments": [],
        "cni.dev/attachments": [],
        "logOptions": {"maxAge": 5},
        "socketDir": "/run/plexus",
        "metricsPort": 0,
        "cniConfigDir": "/etc/cni/net.d",
    }
    with caplog.at_level(logging.DEBUG, logger="plexus.config"):
        load_meta_config(_conf(**known))
    assert _warnings(caplog) == []
    assert not warned


def test_daemon_keys_are_known() -> None:
    daemon = {f.alias or n for n, f in DaemonConfig.model_fields.items()}
    assert daemon <= config.KNOWN_KEYS


def test_unknown_key_warnings_are_bounded(
    warned: set[frozenset[str]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="plexus.config"):
        for i in range(config._MAX_WARNED + 10):
            load_meta_config(_conf(**{f"typo{i}": 1}))
    assert len(_warnings(caplog)) == config._MAX_WARNED == len(warned)


def test_isolation_off_allows_any_namespace() -> None:
    assert load_meta_config(_conf()).namespace_allowed("apps", "other")


def test_unknown_keys_are_kept_for_gc() -> None:
    conf = load_meta_config(_conf(**{"cni.dev/valid-attachments": []}))
    assert conf.model_extra == {"cni.dev/valid-attachments": []}


@pytest.mark.parametrize(
    ("data", "code", "words"),
    [
        (b"{nope", ErrorCode.DECODE_FAILURE, "the plexus config: invalid JSON"),
        pytest.param(
            b"[" * 100_000 + b"]" * 100_000,
            ErrorCode.DECODE_FAILURE,
            "the plexus config is nested deeper",
            id="nested-100000-levels",
        ),
        (_conf(maxNetworksPerPod=0), ErrorCode.INVALID_CONFIG, "maxNetworksPerPod"),
        (b"[]", ErrorCode.DECODE_FAILURE, "JSON object"),
        (_conf(delegates=[]), ErrorCode.INVALID_CONFIG, "clusterNetwork"),
        (_conf(logLevel="loud"), ErrorCode.INVALID_CONFIG, "logLevel"),
        (_conf(namespaceIsolation="maybe"), ErrorCode.INVALID_CONFIG, "namespaceIsolation"),
    ],
)
def test_bad_configs(data: bytes, code: int, words: str) -> None:
    with pytest.raises(CNIError) as caught:
        load_meta_config(data)
    assert caught.value.code == code
    assert words in str(caught.value)


@pytest.mark.parametrize("log_file", [True, False])
def test_thin_mode_typo_goes_to_the_log_file_never_to_stderr(
    log_file: bool,
    warned: set[frozenset[str]],
    plexus_logger: logging.Logger,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The config is read (and warns) before it has configured logging from itself."""
    path = tmp_path / "plexus.log"
    stdin = _conf(
        logToStderr=False,
        logFile=str(path) if log_file else "",
        cniDir=str(tmp_path / "cni"),
        clusterNetwrok="flannel",
    )
    args = CmdArgs("ADD", "c1", "/run/netns/x", "eth0", (), (), stdin)
    MetaPlugin().engine(args)
    assert capfd.readouterr() == ("", "")
    if log_file:
        (line,) = [json.loads(text) for text in path.read_text().splitlines()]
        assert line["msg"] == "unknown meta config key 'clusterNetwrok' ignored"
        assert line["level"] == "warning" and line["keys"] == ["clusterNetwrok"]
