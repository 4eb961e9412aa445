"""BuiltinExecutor routing, the meta-plugin's default executor, imports that stay light."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from cni.env import cni_env
from cni.errors import CNIError
from cni.invoke import ExecExecutor
from cni.skel import UNEXPECTED_ERROR
from delegates import builtin
from delegates.builtin import BuiltinExecutor
from delegates.link import PLUGIN_ERROR
from meta.config import load_meta_config
from meta.install import BINARIES


class Recorder:
    """A fallback executor that records what it was asked to run."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, dict[str, str]]] = []

    def run(self, plugin_type: str, stdin: bytes, env: Mapping[str, str]) -> bytes:
        self.calls.append((plugin_type, stdin, dict(env)))
        return b"fallback"


def _env(command: str = "ADD") -> dict[str, str]:
    return cni_env(command, "cid", "/nonexistent/netns", "eth0", (), ["/usr/lib/cni"])


CONF = json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "mode": "x"}).encode()


def test_hosted_types_run_in_process() -> None:
    fallback = Recorder()
    executor = BuiltinExecutor(fallback=fallback)
    assert executor.hosts("macvlan") and executor.hosts("ipvlan")
    with pytest.raises(CNIError) as info:
        executor.run("macvlan", CONF, _env())
    assert (info.value.code, info.value.msg) == (PLUGIN_ERROR, 'unknown macvlan mode: "x"')
    version = json.loads(executor.run("ipvlan", b"{}", _env("VERSION")))
    assert "1.1.0" in version["supportedVersions"]
    assert fallback.calls == []


def test_other_and_exec_types_go_to_the_fallback() -> None:
    fallback = Recorder()
    executor = BuiltinExecutor(exec_types={"macvlan"}, fallback=fallback)
    assert not executor.hosts("macvlan") and executor.hosts("ipvlan")
    assert executor.run("macvlan", CONF, _env()) == b"fallback"
    assert executor.run("bridge", b"{}", _env()) == b"fallback"
    assert [c[0] for c in fallback.calls] == ["macvlan", "bridge"]
    assert fallback.calls[0][1] == CONF


def test_default_fallback_execs() -> None:
    assert isinstance(BuiltinExecutor().fallback, ExecExecutor)


def test_bad_env_is_a_cni_error() -> None:
    env = _env()
    env["CNI_IFNAME"] = "a/b"
    with pytest.raises(CNIError) as info:
        BuiltinExecutor().run("macvlan", CONF, env)
    assert info.value.code == 4


def test_a_crash_becomes_the_unexpected_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Boom:
        def add(self, args: object) -> None:
            raise RuntimeError("kaboom")

    monkeypatch.setattr(builtin, "hosted_plugin", lambda plugin_type: Boom())
    with pytest.raises(CNIError) as info:
        BuiltinExecutor().run("macvlan", CONF.replace(b'"x"', b'"bridge"'), _env())
    assert (info.value.code, info.value.msg, info.value.details) == (
        UNEXPECTED_ERROR,
        "unexpected error",
        "kaboom",
    )


def test_meta_config_exec_delegates() -> None:
    base = {"cniVersion": "1.1.0", "name": "p", "type": "plexus", "delegates": [{"type": "b"}]}
    assert load_meta_config(json.dumps(base).encode()).exec_delegates == []
    conf = load_meta_config(json.dumps({**base, "execDelegates": ["macvlan"]}).encode())
    assert conf.exec_delegates == ["macvlan"]


def test_binaries_are_installed() -> None:
    assert BINARIES["plexus-macvlan"] == "delegates.macvlan"
    assert BINARIES["plexus-ipvlan"] == "delegates.ipvlan"
