from __future__ import annotations

import io
import json
from ipaddress import ip_interface
from typing import Any

import pytest

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.result import Interface, IPConfig, Result
from cni.skel import dispatch, run


class TinyPlugin:
    """Records verb calls; ADD returns a 1.1.0 result, `fail` makes a verb raise."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.calls: list[str] = []
        self.fail = fail

    def _record(self, verb: str) -> None:
        self.calls.append(verb)
        if self.fail is not None:
            raise self.fail

    def add(self, args: CmdArgs) -> Result:
        self._record("add")
        return Result(
            cni_version="1.1.0",
            interfaces=[Interface(name=args.ifname, mtu=9000, sandbox=args.netns)],
            ips=[IPConfig(address=ip_interface("10.0.0.2/24"), interface=0)],
        )

    def delete(self, args: CmdArgs) -> None:
        self._record("delete")

    def check(self, args: CmdArgs) -> None:
        self._record("check")

    def status(self, args: CmdArgs) -> None:
        self._record("status")

    def gc(self, args: CmdArgs) -> None:
        self._record("gc")


def cmd(command: str, conf: dict[str, Any] | bytes | None = None) -> CmdArgs:
    if conf is None:
        conf = {"cniVersion": "1.0.0", "name": "n", "type": "tiny"}
    stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
    return CmdArgs(command, "cid", "/run/netns/x", "eth0", (), ("/bin",), stdin)


def env(command: str) -> dict[str, str]:
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "cid",
        "CNI_NETNS": "/run/netns/x",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/bin",
    }


def test_version_output() -> None:
    out = json.loads(dispatch(TinyPlugin(), cmd("VERSION", b"")))
    assert out == {
        "cniVersion": "1.1.0",
        "supportedVersions": ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
    }
    limited = json.loads(dispatch(TinyPlugin(), cmd("VERSION", b"junk"), ("0.4.0", "1.0.0")))
    assert limited == {"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0"]}


@pytest.mark.parametrize("version", ["0.3.1", "1.0.0", "1.1.0"])
def test_add_result_is_in_the_conf_version(version: str) -> None:
    conf = {"cniVersion": version, "name": "n", "type": "tiny"}
    out = json.loads(dispatch(TinyPlugin(), cmd("ADD", conf)))
    assert out == Result.from_dict(out).to_dict(version)
    assert out["cniVersion"] == version
    assert ("mtu" in out["interfaces"][0]) == (version == "1.1.0")
    assert ("version" in out["ips"][0]) == (version == "0.3.1")


def test_add_with_legacy_conf_version() -> None:
    conf = {"cniVersion": "0.2.0", "name": "n", "type": "tiny"}
    out = json.loads(dispatch(TinyPlugin(), cmd("ADD", conf)))
    assert out == {"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24"}, "dns": {}}


@pytest.mark.parametrize(
    ("command", "verb"), [("DEL", "delete"), ("CHECK", "check"), ("STATUS", "status"), ("GC", "gc")]
)
def test_other_verbs_print_nothing(command: str, verb: str) -> None:
    plugin = TinyPlugin()
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "tiny"}
    assert dispatch(plugin, cmd(command, conf)) == b""
    assert plugin.calls == [verb]


@pytest.mark.parametrize(
    ("command", "version"),
    [("CHECK", "0.3.1"), ("STATUS", "1.0.0"), ("GC", "1.0.0"), ("ADD", "1.1.0"), ("DEL", "9.0.0")],
)
def test_verb_needs_a_supported_version(command: str, version: str) -> None:
    plugin = TinyPlugin()
    supported = ("0.3.1", "1.0.0") if version == "1.1.0" else ("0.3.1", "1.0.0", "1.1.0")
    conf = {"cniVersion": version, "name": "n", "type": "tiny"}
    with pytest.raises(CNIError) as exc:
        dispatch(plugin, cmd(command, conf), supported)
    assert exc.value.code == ErrorCode.INCOMPATIBLE_VERSION
    assert plugin.calls == []


@pytest.mark.parametrize(
    ("stdin", "code"),
    [
        (b"{", 6),
        (b"[]", 6),
        (b'{"cniVersion":"1.0.0","type":"x"}', 7),
        (b'{"name":"n","cniVersion":"x"}', 6),
    ],
)
def test_bad_conf(stdin: bytes, code: int) -> None:
    with pytest.raises(CNIError) as exc:
        dispatch(TinyPlugin(), cmd("ADD", stdin))
    assert exc.value.code == code


def run_plugin(plugin: TinyPlugin, environ: dict[str, str], stdin: bytes) -> tuple[int, bytes]:
    out = io.BytesIO()
    code = run(plugin, environ=environ, stdin=io.BytesIO(stdin), stdout=out)
    return code, out.getvalue()


def test_run_success() -> None:
    code, out = run_plugin(TinyPlugin(), env("ADD"), cmd("ADD").stdin)
    assert code == 0
    assert json.loads(out)["ips"] == [{"interface": 0, "address": "10.0.0.2/24"}]


def test_run_prints_cni_error_and_exits_1() -> None:
    plugin = TinyPlugin(fail=CNIError(ErrorCode.TRY_AGAIN_LATER, "busy", "retry"))
    conf = {"cniVersion": "0.4.0", "name": "n", "type": "tiny"}
    code, out = run_plugin(plugin, env("DEL"), json.dumps(conf).encode())
    assert code == 1
    assert json.loads(out) == {"cniVersion": "0.4.0", "code": 11, "msg": "busy", "details": "retry"}


def test_run_turns_crashes_into_code_999(capsys: pytest.CaptureFixture[str]) -> None:
    plugin = TinyPlugin(fail=KeyError("boom"))
    code, out = run_plugin(plugin, env("ADD"), cmd("ADD").stdin)
    assert code == 1
    assert json.loads(out) == {
        "cniVersion": "1.0.0",
        "code": 999,
        "msg": "unexpected error",
        "details": "'boom'",
    }
    assert b"Traceback" not in out
    assert "Traceback" in capsys.readouterr().err


def test_run_env_error_uses_current_version_for_undecodable_conf() -> None:
    code, out = run_plugin(TinyPlugin(), {"CNI_COMMAND": "ADD"}, b"not json")
    assert code == 1
    error = json.loads(out)
    assert (error["cniVersion"], error["code"]) == ("1.1.0", 4)
    assert "CNI_CONTAINERID" in error["msg"]


def test_run_version_needs_no_env() -> None:
    code, out = run_plugin(TinyPlugin(), {"CNI_COMMAND": "VERSION"}, b"")
    assert code == 0
    assert json.loads(out)["cniVersion"] == "1.1.0"


@pytest.mark.parametrize("depth", [65, 100_000])
def test_run_refuses_deep_nesting_with_code_6_and_no_traceback(
    depth: int, capsys: pytest.CaptureFixture[str]
) -> None:
    nested = "[" * depth + "]" * depth
    stdin = f'{{"cniVersion":"1.0.0","name":"n","type":"tiny","x":{nested}}}'.encode()
    plugin = TinyPlugin()
    code, out = run_plugin(plugin, env("ADD"), stdin)
    assert code == 1 and plugin.calls == []
    error = json.loads(out)
    assert (error["code"], error["cniVersion"]) == (6, "1.1.0")
    assert error["msg"] == "network config on stdin is nested deeper than 64 levels"
    assert "Traceback" not in capsys.readouterr().err
