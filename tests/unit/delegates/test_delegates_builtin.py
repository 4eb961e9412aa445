"""BuiltinExecutor routing, the meta-plugin's default executor, imports that stay light."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from cni import callscope
from cni.env import cni_env
from cni.errors import CNIError
from cni.invoke import ExecExecutor
from cni.result import Result
from cni.skel import UNEXPECTED_ERROR
from delegates import builtin
from delegates.builtin import BuiltinExecutor
from delegates.link import PLUGIN_ERROR
from delegates.sriov import SriovPlugin
from delegates.sublink import SubLinkPlugin
from meta.config import load_meta_config
from meta.install import install_binaries
from meta.plugin import MetaPlugin
from tests.unit.conftest import Recorder as RecorderPlugin


class Recorder:
    """A fallback executor that records what it was asked to run."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, dict[str, str]]] = []

    def run(self, plugin_type: str, stdin: bytes, env: Mapping[str, str]) -> bytes:
        self.calls.append((plugin_type, stdin, dict(env)))
        return b"fallback"

    def hosts(self, plugin_type: str) -> bool:
        return False


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


def test_a_type_it_does_not_host_is_execd_from_cni_path(
    bin_dir: Path, recorder: RecorderPlugin
) -> None:
    conf = json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "recorder"}).encode()
    env = cni_env("ADD", "cid", "/nonexistent/netns", "eth0", (), [str(bin_dir)])
    out = json.loads(BuiltinExecutor().run("recorder", conf, env))
    assert out["ips"] == [{"address": "192.0.2.7/24", "interface": 0}]
    assert [c["env"]["CNI_COMMAND"] for c in recorder.calls()] == ["ADD"]


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

    monkeypatch.setattr(builtin, "hosted_plugin", lambda *args: Boom())
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


def test_exec_delegates_reach_the_meta_plugins_executor() -> None:
    base = {"cniVersion": "1.1.0", "name": "p", "type": "plexus", "delegates": [{"type": "b"}]}
    conf = load_meta_config(json.dumps({**base, "execDelegates": ["host-local"]}).encode())
    executor = MetaPlugin(configure_logging=False).engine_for(conf, []).runtime.executor
    assert isinstance(executor, BuiltinExecutor)
    assert executor.exec_types == {"host-local"} and executor.hosts("macvlan")


def test_hosted_plugins_get_the_exec_types_for_their_ipam() -> None:
    for kind in ("macvlan", "ipvlan", "sriov"):
        plugin = builtin.hosted_plugin(kind, {"host-local", "macvlan"})
        plain = builtin.hosted_plugin(kind)
        assert isinstance(plugin, SubLinkPlugin | SriovPlugin)
        assert isinstance(plain, SubLinkPlugin | SriovPlugin)
        assert plugin.ipam_exec == {"host-local", "macvlan"} and plain.ipam_exec == frozenset()
        chrooted = ExecExecutor(chroot_dir="/hostroot")
        via = builtin.hosted_plugin(kind, {"host-local"}, chrooted)
        assert isinstance(via, SubLinkPlugin | SriovPlugin) and via.ipam_executor is chrooted


# A stand-in IPAM binary: logs its verb and container, answers ADD with a fixed address.
FAKE_IPAM = """\
import json, os, sys
sys.stdin.read()
with open(os.path.join(os.path.dirname(sys.argv[0]), "calls.log"), "a") as f:
    f.write(os.environ["CNI_COMMAND"] + " " + os.environ["CNI_CONTAINERID"] + "\\n")
if os.environ["CNI_COMMAND"] == "ADD":
    print(json.dumps({"cniVersion": "1.0.0", "ips": [{"address": "192.0.2.9/24"}]}))
"""


@pytest.mark.parametrize("ipam", ["host-local", "static"])
def test_exec_types_route_a_hosted_plugins_ipam(ipam: str, tmp_path: Path) -> None:
    """DEL without a netns only touches IPAM: in-process unless its type is in exec_types."""
    fake = tmp_path / ipam
    fake.write_text(f"#!{sys.executable} -I\n{FAKE_IPAM}")
    fake.chmod(0o755)
    conf = {
        "cniVersion": "1.0.0",
        "name": "n",
        "type": "macvlan",
        "deviceID": "0000:00:00.0",
        "dataDir": str(tmp_path / "sriov"),
        "ipam": {
            "type": ipam,
            "dataDir": str(tmp_path / "data"),
            "ranges": [[{"subnet": "192.0.2.0/24"}]],
            "addresses": [{"address": "192.0.2.9/24"}],
        },
    }
    stdin = json.dumps(conf).encode()
    for plugin_type in ("macvlan", "ipvlan", "sriov"):
        env = cni_env("DEL", f"in-{plugin_type}", "", "eth0", (), [str(tmp_path)])
        assert BuiltinExecutor(fallback=Recorder()).run(plugin_type, stdin, env) == b""
        env = cni_env("DEL", f"ex-{plugin_type}", "", "eth0", (), [str(tmp_path)])
        executor = BuiltinExecutor(exec_types={ipam, "bridge"})  # execs through its fallback
        assert executor.run(plugin_type, stdin, env) == b""
    assert (tmp_path / "calls.log").read_text().split("\n") == [
        "DEL ex-macvlan",
        "DEL ex-ipvlan",
        "DEL ex-sriov",
        "",
    ]


@pytest.mark.parametrize("plugin", ["macvlan", "ipvlan"])
def test_the_installed_binary_runs_its_plugin(tmp_path: Path, plugin: str) -> None:
    install_binaries(tmp_path)
    conf = {"cniVersion": "1.0.0", "name": "n", "type": plugin, "mode": "x"}
    done = subprocess.run(
        [tmp_path / f"plexus-{plugin}"],
        input=json.dumps(conf).encode(),
        env=_env(),
        capture_output=True,
    )
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["msg"] == f'unknown {plugin} mode: "x"'


class Stuck:
    """A fake in-process plugin whose ADD waits for `release`, noting each start; it
    notes the call scope's root it sees (the one of the call it serves)."""

    def __init__(self, release: threading.Event, seen: list[str]) -> None:
        self.release, self.seen = release, seen

    def add(self, args: object) -> Result:
        self.seen.append(callscope.current().root)
        self.release.wait(WAIT)
        return Result(ips=[])


WAIT = 30.0
GOOD = CONF.replace(b'"x"', b'"bridge"')


def _bounded(timeout: float, root: str = "/hostroot") -> Iterator[callscope.CallScope]:
    with callscope.call_scope() as scope:
        scope.timeout, scope.root = timeout, root
        yield scope


def test_an_in_process_plugin_past_its_deadline_fails_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As an exec'd plugin's: code 5 naming it and the deadline, at the deadline; the
    work runs on with the call's scope (it cannot be killed) and its result is dropped."""
    release, seen = threading.Event(), list[str]()
    monkeypatch.setattr(builtin, "hosted_plugin", lambda *args: Stuck(release, seen))
    try:
        for _ in _bounded(0.3):
            started = time.monotonic()
            with pytest.raises(CNIError) as info:
                BuiltinExecutor().run("macvlan", GOOD, _env())
            assert 0.25 < time.monotonic() - started < WAIT / 2
        assert (info.value.code, seen) == (5, ["/hostroot"])
        assert info.value.msg.startswith("plugin macvlan timed out after 0.3 s (in-process")
    finally:
        release.set()


def test_a_late_call_of_a_stuck_attachment_never_runs_and_others_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Work that outlives its call holds its attachment: a later call of that attachment
    fails at its own deadline and does not run even once the stuck work ends (it would
    run after its caller gave up); another attachment's call runs meanwhile."""
    release, seen = threading.Event(), list[str]()
    monkeypatch.setattr(builtin, "hosted_plugin", lambda *args: Stuck(release, seen))
    executor = BuiltinExecutor()
    try:
        for _ in _bounded(0.2):
            for _ in range(2):
                with pytest.raises(CNIError, match="timed out"):
                    executor.run("macvlan", GOOD, _env())
            assert seen == ["/hostroot"]
            other = {**_env(), "CNI_IFNAME": "net1"}
            with pytest.raises(CNIError, match="timed out"):
                executor.run("macvlan", GOOD, other)
            assert len(seen) == 2
    finally:
        release.set()
    deadline = time.monotonic() + WAIT
    while builtin._attachments._locks and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (builtin._attachments._locks, len(seen)) == ({}, 2)


def test_a_plugins_own_calls_through_the_executor_run_within_its_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hosted plugin reaching its IPAM through this executor (same attachment) runs it
    on its own thread, not behind its own attachment lock."""
    executor = BuiltinExecutor()

    class Nesting:
        def add(self, args: object) -> Result:
            executor.run("ipvlan", GOOD, _env("VERSION"))
            executor.run("macvlan", GOOD, _env("DEL"))
            return Result(ips=[])

        def delete(self, args: object) -> None:
            pass

        check = status = gc = delete

    monkeypatch.setattr(builtin, "hosted_plugin", lambda *args: Nesting())
    for _ in _bounded(5):
        assert json.loads(executor.run("macvlan", GOOD, _env()))["cniVersion"] == "1.0.0"
