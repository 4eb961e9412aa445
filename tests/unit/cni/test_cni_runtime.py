from __future__ import annotations

import base64
import json
import logging
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cni.cache import CacheEntry
from cni.config import NetworkConfigList, load_network_config
from cni.errors import CNIError, ErrorCode
from cni.runtime import CNIRuntime, RuntimeConf

REPO_ROOT = Path(__file__).resolve().parents[3]


def host_local_conf(data_dir: Path, version: str = "1.0.0") -> dict[str, Any]:
    return {
        "cniVersion": version,
        "name": "hl",
        "type": "host-local",
        "ipam": {
            "type": "host-local",
            "dataDir": str(data_dir),
            "ranges": [[{"subnet": "10.77.0.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    }


def load(obj: dict[str, Any]) -> NetworkConfigList:
    return load_network_config(json.dumps(obj).encode())


def rt(cid: str = "cid1", **kwargs: Any) -> RuntimeConf:
    return RuntimeConf(container_id=cid, netns="/run/netns/test", ifname="eth0", **kwargs)


@pytest.fixture
def runtime(tmp_path: Path, bin_dir: Path) -> CNIRuntime:
    return CNIRuntime(["/usr/lib/cni", str(bin_dir)], tmp_path / "cache")


def test_add_check_del_with_host_local(
    host_local: str, tmp_path: Path, runtime: CNIRuntime
) -> None:
    net = load(host_local_conf(tmp_path / "ipam"))
    args = (("IgnoreUnknown", "1"), ("K8S_POD_NAME", "web-0"))
    attachment = rt(args=args, capability_args={"mac": "aa:bb"})
    result = runtime.add(net, attachment)
    assert result.cni_version == "1.0.0"
    assert result.ip_strings() == ["10.77.0.2"]
    assert (tmp_path / "ipam" / "hl" / "10.77.0.2").exists()

    cache_file = tmp_path / "cache" / "results" / "hl-cid1-eth0"
    entry = json.loads(cache_file.read_bytes())
    assert entry == {
        "kind": "cniCacheV1",
        "containerId": "cid1",
        "config": base64.b64encode(net.raw).decode(),
        "ifName": "eth0",
        "networkName": "hl",
        "netns": "/run/netns/test",
        "cniArgs": [list(pair) for pair in args],
        "capabilityArgs": {"mac": "aa:bb"},
        "result": result.to_dict("1.0.0"),
    }
    assert stat.S_IMODE(cache_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache_file.parent.stat().st_mode) == 0o700
    assert runtime.cached_result("hl", attachment) == result

    runtime.check(net, attachment)
    runtime.delete(net, attachment)
    assert not cache_file.exists()
    assert not (tmp_path / "ipam" / "hl" / "10.77.0.2").exists()
    assert runtime.cached_result("hl", attachment) is None
    runtime.delete(net, attachment)  # DEL is idempotent


def test_check_without_cached_result(host_local: str, tmp_path: Path, runtime: CNIRuntime) -> None:
    with pytest.raises(CNIError) as exc:
        runtime.check(load(host_local_conf(tmp_path / "ipam")), rt())
    assert exc.value.code == ErrorCode.UNKNOWN_CONTAINER
    assert "run ADD first" in exc.value.details


def test_host_local_error_keeps_its_code(
    host_local: str, tmp_path: Path, runtime: CNIRuntime
) -> None:
    conf = host_local_conf(tmp_path / "ipam", version="0.4.0")
    net = load(conf)
    runtime.add(net, rt())
    # Another runtime that cached the result but whose IPAM state is gone: host-local fails.
    (tmp_path / "ipam" / "hl" / "10.77.0.2").unlink()
    with pytest.raises(CNIError) as exc:
        runtime.check(net, rt())
    assert exc.value.code == 999
    assert exc.value.msg.startswith('plugin "host-local" failed (check): host-local:')


def test_legacy_version_with_host_local(
    host_local: str, tmp_path: Path, runtime: CNIRuntime
) -> None:
    net = load(host_local_conf(tmp_path / "ipam", version="0.2.0"))
    result = runtime.add(net, rt())
    assert result.to_dict("0.2.0")["ip4"]["ip"] == "10.77.0.2/24"
    with pytest.raises(CNIError) as exc:
        runtime.check(net, rt())
    assert exc.value.code == ErrorCode.INCOMPATIBLE_VERSION
    runtime.delete(net, rt())
    assert runtime.cache.entries() == []


def test_host_local_rejects_1_1_0(host_local: str, tmp_path: Path, runtime: CNIRuntime) -> None:
    with pytest.raises(CNIError) as exc:
        runtime.add(load(host_local_conf(tmp_path / "ipam", version="1.1.0")), rt())
    assert exc.value.code == ErrorCode.INCOMPATIBLE_VERSION
    assert runtime.cache.entries() == []


def test_chain_passes_prev_result_and_capabilities(
    host_local: str, tmp_path: Path, runtime: CNIRuntime, recorder: Any
) -> None:
    hl = host_local_conf(tmp_path / "ipam")
    net = load(
        {
            "cniVersion": "1.0.0",
            "name": "chain",
            "plugins": [
                {"type": "host-local", "ipam": hl["ipam"]},
                {"type": "recorder", "capabilities": {"portMappings": True}},
            ],
        }
    )
    caps = {"portMappings": [{"hostPort": 80}], "bandwidth": {"ingressRate": 1}}
    result = runtime.add(net, rt(capability_args=caps))
    assert result.ip_strings() == ["10.77.0.2"]
    (add,) = recorder.calls()
    assert add["conf"]["prevResult"] == result.to_dict("1.0.0")
    assert add["conf"]["runtimeConfig"] == {"portMappings": [{"hostPort": 80}]}
    assert add["conf"]["name"] == "chain"
    assert add["env"] == {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "cid1",
        "CNI_NETNS": "/run/netns/test",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": f"/usr/lib/cni:{recorder.bin_dir}",
    }

    runtime.check(net, rt())
    runtime.delete(net, rt())
    check, delete = recorder.calls()[1:]
    assert check["conf"]["prevResult"] == delete["conf"]["prevResult"] == result.to_dict("1.0.0")
    assert not (tmp_path / "ipam" / "hl" / "10.77.0.2").exists()


def test_del_runs_in_reverse_order(
    runtime: CNIRuntime, make_recorder_plugin: Callable[..., Any]
) -> None:
    first, _ = make_recorder_plugin("first"), make_recorder_plugin("second")
    net = load(
        {"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "first"}, {"type": "second"}]}
    )
    runtime.add(net, rt())
    runtime.delete(net, rt())
    calls = [(c["plugin"], c["env"]["CNI_COMMAND"]) for c in first.calls()]
    assert calls == [("first", "ADD"), ("second", "ADD"), ("second", "DEL"), ("first", "DEL")]


def test_failed_add_caches_nothing(
    runtime: CNIRuntime, make_recorder_plugin: Callable[..., Any]
) -> None:
    make_recorder_plugin("ok")
    make_recorder_plugin("bad", fail=("ADD",))
    net = load({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "ok"}, {"type": "bad"}]})
    with pytest.raises(CNIError) as exc:
        runtime.add(net, rt())
    assert exc.value.code == ErrorCode.TRY_AGAIN_LATER
    assert exc.value.msg == 'plugin "bad" failed (add): recorder says no'
    assert runtime.cache.entries() == []


def test_missing_plugin(runtime: CNIRuntime) -> None:
    with pytest.raises(CNIError) as exc:
        runtime.add(load({"cniVersion": "1.0.0", "name": "n", "type": "absent"}), rt())
    assert exc.value.code == ErrorCode.INVALID_CONFIG
    assert 'failed to find plugin "absent"' in exc.value.msg


def test_disable_check(runtime: CNIRuntime, recorder: Any) -> None:
    net = load(
        {
            "cniVersion": "1.0.0",
            "name": "n",
            "disableCheck": True,
            "plugins": [{"type": "recorder"}],
        }
    )
    runtime.check(net, rt())
    assert recorder.calls() == []


def test_delete_survives_a_corrupt_cache_entry(runtime: CNIRuntime, recorder: Any) -> None:
    net = load({"cniVersion": "1.0.0", "name": "n", "type": "recorder"})
    path = runtime.cache.path("n", "cid1", "eth0")
    path.parent.mkdir(parents=True)
    path.write_text("{broken")
    runtime.delete(net, rt())
    assert "prevResult" not in recorder.calls()[0]["conf"]
    assert not path.exists()


def test_status(runtime: CNIRuntime, make_recorder_plugin: Callable[..., Any]) -> None:
    recorder = make_recorder_plugin()
    plugin = {"type": "recorder", "capabilities": {"mac": True}}
    runtime.status(load({"cniVersion": "1.1.0", "name": "n", "plugins": [plugin]}))
    (call,) = recorder.calls()
    assert call["env"] == {"CNI_COMMAND": "STATUS", "CNI_PATH": f"/usr/lib/cni:{recorder.bin_dir}"}
    assert call["conf"] == {**plugin, "name": "n", "cniVersion": "1.1.0"}


def test_status_is_a_no_op_before_1_1_0(
    runtime: CNIRuntime, make_recorder_plugin: Callable[..., Any]
) -> None:
    recorder = make_recorder_plugin(fail=("STATUS",))
    runtime.status(load({"cniVersion": "1.0.0", "name": "n", "type": "recorder"}))
    assert recorder.calls() == []
    with pytest.raises(CNIError) as exc:
        runtime.status(load({"cniVersion": "1.1.0", "name": "n", "type": "recorder"}))
    assert exc.value.code == ErrorCode.TRY_AGAIN_LATER


def test_gc_deletes_stale_host_local_attachments(
    host_local: str, tmp_path: Path, runtime: CNIRuntime
) -> None:
    net = load(host_local_conf(tmp_path / "ipam"))
    runtime.add(net, rt("cid1"))
    runtime.add(net, rt("cid2"))
    other = CacheEntry(container_id="cid2", config=b"{}", ifname="eth0", network_name="other")
    runtime.cache.save(other)
    runtime.gc(net, [("cid1", "eth0")])
    assert [(e.network_name, e.container_id) for e in runtime.cache.entries()] == [
        ("hl", "cid1"),
        ("other", "cid2"),
    ]
    assert (tmp_path / "ipam" / "hl" / "10.77.0.2").exists()
    assert not (tmp_path / "ipam" / "hl" / "10.77.0.3").exists()


def test_gc_calls_plugins_from_1_1_0(runtime: CNIRuntime, recorder: Any) -> None:
    net = load({"cniVersion": "1.1.0", "name": "n", "plugins": [{"type": "recorder"}]})
    first = runtime.add(net, rt("cid1"))
    runtime.add(net, rt("cid2"))
    runtime.gc(net, [("cid1", "eth0"), ("gone", "net1")])
    delete, gc = recorder.calls()[2:]
    assert delete["env"]["CNI_COMMAND"] == "DEL"
    assert delete["env"]["CNI_CONTAINERID"] == "cid2"
    assert delete["conf"]["prevResult"] == first.to_dict("1.1.0")
    assert gc["env"] == {"CNI_COMMAND": "GC", "CNI_PATH": f"/usr/lib/cni:{recorder.bin_dir}"}
    valid = [{"containerID": "cid1", "ifname": "eth0"}, {"containerID": "gone", "ifname": "net1"}]
    assert gc["conf"]["cni.dev/valid-attachments"] == valid
    assert gc["conf"]["cni.dev/attachments"] == valid
    assert [e.container_id for e in runtime.cache.entries("n")] == ["cid1"]


def test_gc_respects_disable_gc(runtime: CNIRuntime, recorder: Any) -> None:
    net = load(
        {"cniVersion": "1.1.0", "name": "n", "disableGC": True, "plugins": [{"type": "recorder"}]}
    )
    runtime.add(net, rt("cid1"))
    runtime.gc(net, [])
    assert len(recorder.calls()) == 1
    assert len(runtime.cache.entries()) == 1


def test_gc_continues_past_errors(
    runtime: CNIRuntime, make_recorder_plugin: Callable[..., Any]
) -> None:
    recorder = make_recorder_plugin(fail=("DEL", "GC"))
    net = load({"cniVersion": "1.1.0", "name": "n", "plugins": [{"type": "recorder"}]})
    runtime.add(net, rt("cid1"))
    runtime.add(net, rt("cid2"))
    with pytest.raises(CNIError) as exc:
        runtime.gc(net, [])
    assert exc.value.code == ErrorCode.TRY_AGAIN_LATER
    assert "3 times" in exc.value.msg
    assert "stale attachment cid1 eth0" in exc.value.details
    assert "stale attachment cid2 eth0" in exc.value.details
    commands = [c["env"]["CNI_COMMAND"] for c in recorder.calls()]
    assert commands == ["ADD", "ADD", "DEL", "DEL", "GC"]
    assert len(runtime.cache.entries("n")) == 2


def _plugin_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [vars(r) for r in caplog.records if r.name == "plexus.cni" and hasattr(r, "ms")]


def test_plugin_calls_are_logged(
    runtime: CNIRuntime, recorder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cid = "0123456789abcdef0123"
    pod = (("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", "apps"), ("K8S_POD_NAME", "web-0"))
    with caplog.at_level(logging.INFO, logger="plexus.cni"):
        runtime.add(
            load({"cniVersion": "1.0.0", "name": "n", "type": "recorder"}), rt(cid, args=pod)
        )
    (fields,) = _plugin_lines(caplog)
    assert fields["msg"] == "plugin add"  # identity in fields, not in the text
    assert {k: fields[k] for k in ("cid", "pod", "plugin", "verb", "network", "outcome")} == {
        "cid": "0123456789ab",
        "pod": "apps/web-0",
        "plugin": "recorder",
        "verb": "add",
        "network": "n",
        "outcome": "ok",
    }
    assert isinstance(fields["ms"], float) and fields["ms"] >= 0


def test_failed_plugin_calls_are_logged_with_their_error(
    runtime: CNIRuntime, make_recorder_plugin: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    make_recorder_plugin(fail=("DEL",))
    net = load({"cniVersion": "1.0.0", "name": "n", "type": "recorder"})
    with caplog.at_level(logging.INFO, logger="plexus.cni"), pytest.raises(CNIError):
        runtime.delete(net, rt(args=(("K8S_POD_NAME", "solo"),)))
    (fields,) = _plugin_lines(caplog)
    assert (fields["levelname"], fields["verb"], fields["outcome"]) == ("ERROR", "del", "error")
    assert fields["cid"] == "cid1" and fields["pod"] == "default/solo"
    assert "recorder says no" in fields["error"]


def test_status_calls_are_logged_without_a_container(
    runtime: CNIRuntime, recorder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="plexus.cni"):
        runtime.status(load({"cniVersion": "1.1.0", "name": "n", "type": "recorder"}))
    (fields,) = _plugin_lines(caplog)
    assert (fields["verb"], fields["plugin"]) == ("status", "recorder")
    assert "cid" not in fields and "pod" not in fields


_SKEL_PLUGIN = f"""\
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from ipaddress import ip_interface
from cni.result import IPConfig, Result
from cni.skel import run

class Plugin:
    def add(self, args):
        print("stray print goes nowhere useful", file=sys.stderr)
        return Result(ips=[IPConfig(address=ip_interface("198.51.100.4/24"))])
    def delete(self, args): pass
    def check(self, args): pass
    def status(self, args): pass
    def gc(self, args): raise RuntimeError("gc exploded")

sys.exit(run(Plugin()))
"""


def test_python_skel_plugin_end_to_end(
    runtime: CNIRuntime, make_plugin: Callable[[str, str], Path]
) -> None:
    make_plugin("pyplug", _SKEL_PLUGIN)
    net = load({"cniVersion": "0.4.0", "name": "py", "type": "pyplug"})
    result = runtime.add(net, rt())
    assert result.to_dict("0.4.0")["ips"] == [{"version": "4", "address": "198.51.100.4/24"}]
    runtime.check(net, rt())
    runtime.delete(net, rt())
    net11 = load({"cniVersion": "1.1.0", "name": "py", "type": "pyplug"})
    runtime.status(net11)
    with pytest.raises(CNIError) as exc:
        runtime.gc(net11, [])
    assert (exc.value.code, exc.value.details) == (999, "gc exploded")


@pytest.mark.parametrize(
    ("output", "code"),
    [("not json", 6), ("[]", 6), ('{"cniVersion": "1.0.0", "ips": [{}]}', 6), ("{}", 1)],
)
def test_unusable_add_result(
    runtime: CNIRuntime, make_plugin: Callable[[str, str], Path], output: str, code: int
) -> None:
    make_plugin("liar", f"print({output!r})\n")
    net = load({"cniVersion": "0.2.0", "name": "n", "type": "liar"})
    with pytest.raises(CNIError) as exc:
        runtime.add(net, rt())
    assert exc.value.code == code
    assert exc.value.msg.startswith('plugin "liar" printed an unusable ADD result')
