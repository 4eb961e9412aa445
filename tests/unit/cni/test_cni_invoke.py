from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from cni.env import cni_env
from cni.errors import CNIError, ErrorCode
from cni.invoke import ExecExecutor, find_plugin, version_info

PluginMaker = Callable[[str, str], Path]


def test_find_plugin_first_in_path_order(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for d in (first, second):
        d.mkdir()
        (d / "p").write_text("#!/bin/sh\n")
        (d / "p").chmod(0o755)
    assert find_plugin("p", [str(first), str(second)]) == str(first / "p")


def test_find_plugin_skips_dirs_and_non_executables(tmp_path: Path) -> None:
    (tmp_path / "a" / "p").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "p").write_text("not executable")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "p").write_text("#!/bin/sh\n")
    (tmp_path / "c" / "p").chmod(0o700)
    paths = [str(tmp_path / d) for d in ("missing", "a", "b", "c")]
    assert find_plugin("p", paths) == str(tmp_path / "c" / "p")


@pytest.mark.parametrize("name", ["", "../p", "/bin/sh", "a/b"])
def test_find_plugin_rejects_paths(name: str) -> None:
    with pytest.raises(CNIError) as exc:
        find_plugin(name, ["/bin"])
    assert exc.value.code == ErrorCode.INVALID_CONFIG


def test_find_plugin_resolves_symlinks_inside_the_root(tmp_path: Path) -> None:
    """A host's CNI bin dir often holds absolute links (to /usr/lib/cni/...): seen from a
    chrootDir they point inside it, not into the daemon's own filesystem."""
    root = tmp_path / "hostroot"
    (root / "usr/lib/cni").mkdir(parents=True)
    (root / "opt/cni/bin").mkdir(parents=True)
    real = root / "usr/lib/cni/px-in-root"
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    (root / "opt/cni/bin/bridge").symlink_to("/usr/lib/cni/px-in-root")
    (root / "opt/cni/bin/rel").symlink_to("../../../usr/lib/cni/px-in-root")
    assert find_plugin("bridge", ["/opt/cni/bin"], str(root)) == "/opt/cni/bin/bridge"
    assert find_plugin("rel", ["/opt/cni/bin"], str(root)) == "/opt/cni/bin/rel"
    (root / "opt/cni/bin/loop").symlink_to("/opt/cni/bin/loop")
    with pytest.raises(CNIError):
        find_plugin("loop", ["/opt/cni/bin"], str(root))


def test_find_plugin_not_found(tmp_path: Path) -> None:
    with pytest.raises(CNIError) as exc:
        find_plugin("nope", [str(tmp_path), "/nonexistent"])
    assert exc.value.code == ErrorCode.INVALID_CONFIG
    assert exc.value.msg == f'failed to find plugin "nope" in path [{tmp_path} /nonexistent]'


def run(bin_dir: Path, name: str, command: str = "ADD", timeout: float | None = None) -> bytes:
    env = cni_env(command, "cid", "/run/netns/x", "eth0", [("A", "1")], [str(bin_dir)])
    return ExecExecutor(timeout).run(name, b'{"cniVersion":"1.0.0"}', env)


def test_plugin_error_json_becomes_cni_error(make_plugin: PluginMaker, bin_dir: Path) -> None:
    make_plugin(
        "failer",
        "import json, sys\n"
        'error = {"cniVersion": "1.0.0", "code": 104, "msg": "vf busy", "details": "d"}\n'
        "print(json.dumps(error))\n"
        "sys.exit(1)\n",
    )
    with pytest.raises(CNIError) as exc:
        run(bin_dir, "failer")
    assert (exc.value.code, exc.value.msg, exc.value.details) == (104, "vf busy", "d")


def test_unparseable_failure_output(make_plugin: PluginMaker, bin_dir: Path) -> None:
    make_plugin("garbage", "import sys\nprint('panic: nil pointer')\nsys.exit(2)\n")
    with pytest.raises(CNIError) as exc:
        run(bin_dir, "garbage")
    assert exc.value.code == ErrorCode.IO_FAILURE
    assert exc.value.msg == 'netplugin failed: "panic: nil pointer"'


def test_failure_with_only_stderr(make_plugin: PluginMaker, bin_dir: Path) -> None:
    make_plugin("loud", "import sys\nsys.stderr.write('cannot open netns\\n')\nsys.exit(1)\n")
    with pytest.raises(CNIError) as exc:
        run(bin_dir, "loud")
    assert exc.value.code == ErrorCode.IO_FAILURE
    assert exc.value.msg == 'netplugin failed: "cannot open netns"'


def test_failure_without_output(make_plugin: PluginMaker, bin_dir: Path) -> None:
    make_plugin("mute", "import sys\nsys.exit(3)\n")
    with pytest.raises(CNIError) as exc:
        run(bin_dir, "mute")
    assert exc.value.code == ErrorCode.IO_FAILURE
    assert "exit status 3" in exc.value.msg


def test_stderr_of_a_successful_plugin_is_logged(
    make_plugin: PluginMaker, bin_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_plugin("chatty", "import sys\nsys.stderr.write('debug line')\nprint('{}')\n")
    with caplog.at_level(logging.INFO, logger="plexus.cni"):
        assert run(bin_dir, "chatty").strip() == b"{}"
    assert any("debug line" in r.getMessage() for r in caplog.records)


def test_timeout(make_plugin: PluginMaker, bin_dir: Path) -> None:
    make_plugin("slow", "import time\ntime.sleep(30)\n")
    with pytest.raises(CNIError) as exc:
        run(bin_dir, "slow", timeout=0.5)
    assert exc.value.code == ErrorCode.IO_FAILURE
    assert "timed out" in exc.value.msg


def test_env_is_exactly_the_given_cni_vars(
    make_plugin: PluginMaker, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_plugin(
        "envdump",
        "import json, os\n"
        "print(json.dumps({k: v for k, v in os.environ.items()"
        " if k.startswith('CNI_') or k == 'PLEXUS_MARK'}))\n",
    )
    monkeypatch.setenv("CNI_NETNS", "/stale/from/parent")
    monkeypatch.setenv("CNI_IFNAME", "stale0")
    monkeypatch.setenv("PLEXUS_MARK", "kept")
    env = cni_env("DEL", "cid", "", "eth0", (), [str(bin_dir)])
    seen = json.loads(ExecExecutor().run("envdump", b"{}", env))
    assert seen == {
        "CNI_COMMAND": "DEL",
        "CNI_CONTAINERID": "cid",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(bin_dir),
        "PLEXUS_MARK": "kept",
    }


def test_missing_cni_path() -> None:
    with pytest.raises(CNIError) as exc:
        ExecExecutor().run("host-local", b"{}", {"CNI_COMMAND": "VERSION"})
    assert exc.value.code == ErrorCode.INVALID_CONFIG


def test_version_info_of_host_local(host_local: str) -> None:
    info = version_info(ExecExecutor(), "host-local", [host_local])
    assert "1.0.0" in info["supportedVersions"]
    assert "0.4.0" in info["supportedVersions"]


def test_version_info_rejects_bad_output(make_plugin: PluginMaker, bin_dir: Path) -> None:
    make_plugin("odd", "print('[]')\n")
    with pytest.raises(CNIError) as exc:
        version_info(ExecExecutor(), "odd", [str(bin_dir)])
    assert exc.value.code == ErrorCode.DECODE_FAILURE


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_plugin_printing_past_the_bound_fails_the_call(
    make_plugin: PluginMaker, bin_dir: Path, stream: str
) -> None:
    flood = f"import sys, time\nsys.{stream}.write('x' * (32 << 20))\ntime.sleep(60)\n"
    make_plugin("flood", flood)
    with pytest.raises(CNIError) as exc:
        run(bin_dir, "flood", timeout=20)
    assert exc.value.code == ErrorCode.IO_FAILURE
    assert exc.value.msg == f"plugin flood printed more than 8 MiB on {stream} and was killed"
