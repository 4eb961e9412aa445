"""The node daemon behind the compiled shim: same results, plus what only a daemon can do."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from meta.daemon import protocol
from tests.netns.conftest import Node
from tests.netns.daemon import PLEXUS, Daemon, running
from tests.wait import wait_for


@pytest.fixture
def daemon(node: Node) -> Iterator[Daemon]:
    with running(node) as d:  # DELs through the daemon while it still runs
        yield d


def test_add_check_del_are_served_by_the_daemon(node: Node, daemon: Daemon) -> None:
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("web", "macvlan-net")
    netns = node.pod_netns()

    result = node.ok("ADD", netns=netns, cid="c-web", pod="web")
    node.ok("CHECK", netns=netns, cid="c-web", pod="web")

    assert result is not None and node.links(netns) == ["eth0", "lo", "net1"]
    assert len(node.network_status("web")) == 2
    assert daemon.metric("plexus_requests_total", verb="ADD", result="ok") == 1
    assert daemon.metric("plexus_requests_total", verb="CHECK", result="ok") == 1
    assert (
        daemon.metric(
            "plexus_delegate_seconds_count",
            verb="add",
            network="default/macvlan-net",
            delegate="macvlan",
        )
        == 1
    )
    node.ok("DEL", netns=netns, cid="c-web", pod="web")
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []


def test_socket_is_root_only(daemon: Daemon) -> None:
    assert daemon.socket.parent.stat().st_mode & 0o777 == 0o700
    assert daemon.socket.stat().st_mode & 0o777 == 0o600


def test_health_endpoints(daemon: Daemon) -> None:
    assert daemon.get("/healthz") == (200, "ok\n")
    assert daemon.get("/readyz") == (200, "ok\n")
    assert daemon.get("/nope")[0] == 404


def _raw(daemon: Daemon, payload: bytes) -> tuple[int, dict[str, Any]]:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(15)
        s.connect(str(daemon.socket))
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        code, out = protocol.read_response(s)
    return code, json.loads(out)


@pytest.mark.parametrize(
    ("payload", "code", "words"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", 6, "unknown protocol"),
        (b"PXS1\x00\x00", 6, "truncated"),
        (b"PXS1\xff\xff\xff\xff", 6, "over the"),
        (protocol.encode_request({"CNI_COMMAND": "ADD"}, b"{}"), 4, "CNI_CONTAINERID"),
        (protocol.encode_request({"CNI_COMMAND": "NOPE"}, b"{}"), 4, "NOPE"),
        (
            protocol.encode_request(
                {
                    "CNI_COMMAND": "ADD",
                    "CNI_CONTAINERID": "c",
                    "CNI_NETNS": "/x",
                    "CNI_IFNAME": "eth0",
                    "CNI_PATH": "/x",
                },
                b"{nope",
            ),
            6,
            "network config on stdin: invalid JSON",
        ),
    ],
)
def test_malformed_requests_get_errors_and_the_daemon_lives(
    daemon: Daemon, payload: bytes, code: int, words: str
) -> None:
    exit_code, error = _raw(daemon, payload)
    assert exit_code == 1 and error["code"] == code
    assert words in error["msg"] + error.get("details", "")
    assert daemon.get("/healthz")[0] == 200


def test_del_after_a_daemon_restart(node: Node, daemon: Daemon) -> None:
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("p", "macvlan-net")
    netns = node.pod_netns()
    node.ok("ADD", netns=netns, cid="c-p", pod="p")
    daemon.stop()
    daemon.start()
    node.ok("DEL", netns=netns, cid="c-p", pod="p")
    assert node.links(netns) == ["lo"] and node.reserved_ips() == []


def _slow_network(node: Node) -> None:
    """NAD slow-net: macvlan chained with a plugin that takes 3 s on ADD."""
    slow = node.bin / "slow"
    slow.write_text(
        "#!/bin/sh\n# a chained plugin that takes its time on ADD and does nothing else\n"
        '[ "$CNI_COMMAND" = ADD ] || exit 0\nsleep 3\n'
        "python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)[\"prevResult\"]))'\n"
    )
    slow.chmod(0o755)
    node.nad(
        "slow-net",
        {
            "cniVersion": "1.0.0",
            "name": "slow-net",
            "plugins": [node.macvlan_conf(), {"type": "slow"}],
        },
    )


def _wait_for_link(node: Node, netns: str, ifname: str) -> None:
    wait_for(lambda: ifname in node.links(netns), f"{ifname} in {netns}")


def test_daemon_killed_mid_add_then_del_and_gc_leave_nothing(node: Node, daemon: Daemon) -> None:
    _slow_network(node)
    node.pod("k", "slow-net")
    netns = node.pod_netns()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(node.cni, "ADD", netns=netns, cid="c-k", pod="k")
        _wait_for_link(node, netns, "net1")
        daemon.stop(signal.SIGKILL)
        answer = pending.result(timeout=30)
    assert answer.returncode != 0 and json.loads(answer.stdout)["code"] == 11
    assert node.reserved_ips()  # the half-done ADD left its IPs behind...

    daemon.start()
    node.ok("DEL", netns=netns, cid="c-k", pod="k")
    node.ok("GC", conf=node.meta(**{"cni.dev/valid-attachments": []}))
    assert node.links(netns) == ["lo"]  # ...and DEL + GC take all of it back
    assert node.reserved_ips() == []
    assert list((node.cni_dir / "records").iterdir()) == []
    assert [p for p in (node.cni_dir / "results").iterdir()] == []


def test_sigterm_lets_an_in_flight_add_finish(node: Node, daemon: Daemon) -> None:
    _slow_network(node)
    node.pod("t", "slow-net")
    netns = node.pod_netns()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(node.cni, "ADD", netns=netns, cid="c-t", pod="t")
        _wait_for_link(node, netns, "net1")
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        answer = pending.result(timeout=30)
        assert daemon.proc.wait(timeout=30) == 0
    assert answer.returncode == 0, answer.stdout
    assert len(node.network_status("t")) == 2
    assert not daemon.socket.exists()  # later calls fall back to thin mode


def test_hundred_concurrent_adds_through_the_shim(node: Node, daemon: Daemon) -> None:
    node.nad("macvlan-net", node.macvlan_conf())
    pods = [f"b{i}" for i in range(100)]
    spaces = {}
    for pod in pods:
        node.pod(pod, "macvlan-net")
        spaces[pod] = node.pod_netns()

    with ThreadPoolExecutor(max_workers=100) as pool:
        added = list(
            pool.map(lambda p: node.cni("ADD", netns=spaces[p], cid=f"c-{p}", pod=p), pods)
        )

    failures = [d.stdout for d in added if d.returncode]
    assert failures == []
    ips = [ip for pod in pods for s in node.network_status(pod) for ip in s["ips"]]
    assert len(ips) == 200 and len(set(ips)) == 200
    rss = daemon.peak_rss_mib()
    print(f"daemon peak RSS after 100 concurrent ADDs: {rss:.1f} MiB")
    assert rss < 150
    with ThreadPoolExecutor(max_workers=100) as pool:
        deleted = list(
            pool.map(lambda p: node.cni("DEL", netns=spaces[p], cid=f"c-{p}", pod=p), pods)
        )
    assert [d.returncode for d in deleted] == [0] * 100
    assert node.reserved_ips() == []
    node.added.clear()


def test_status_fails_until_the_daemon_is_ready(node: Node, daemon: Daemon) -> None:
    """STATUS goes through the shim to the daemon: not ready (informers not synced) is
    code 11, so the runtime reports the node's network not ready and retries."""
    node.ok("STATUS")  # a ready daemon: the default network decides
    kubeconfig = node.root / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    daemon.stop()
    syncing = Daemon(node, kubeconfig=str(kubeconfig), clusterDir="")  # no API server answers
    # Daemon.start() waits for /readyz, which this one never reaches: wait for /healthz.
    syncing.proc = subprocess.Popen(
        ["ip", "netns", "exec", node.name, PLEXUS, "daemon", "--config", str(syncing.config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _status_code(syncing, "/healthz") == 200, "/healthz", timeout=60)
        error = node.error("STATUS")
        assert (error["code"], error["msg"]) == (11, "plexus daemon not ready yet")
        assert syncing.get("/readyz")[0] == 503
    finally:
        syncing.stop()


def test_cni_config_is_generated_watched_and_kept_until_uninstall(node: Node) -> None:
    net_d = node.root / "net.d"
    net_d.mkdir()
    primary: dict[str, Any] = {
        "cniVersion": "1.0.0",
        "name": "primary",
        "plugins": [
            {"type": "bridge", "bridge": "x"},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    (net_d / "10-primary.conflist").write_text(json.dumps(primary))
    indicator = node.root / "ready-flag"
    d = Daemon(  # our own cniVersion (1.1.0) is newer than the primary's: not used
        node, cniConfigDir=str(net_d), readinessindicatorfile=str(indicator), cniVersion="1.1.0"
    )
    d.start()
    try:
        generated = net_d / "00-plexus.conflist"
        with _file_calls(d, node.root / "strace.out") as calls:
            # A sync looks for the indicator first: after two looks, one sync is done.
            wait_for(lambda: calls(indicator) >= 2, "two syncs of the CNI config")
        assert not generated.exists()  # the readiness indicator is not there yet
        indicator.touch()
        conf = wait_for(
            lambda: json.loads(generated.read_text()) if generated.exists() else None,
            "the generated CNI config",
        )
        assert conf is not None
        assert conf["cniVersion"] == "1.0.0" and conf["name"] == "plexus-cni-network"
        plugin = conf["plugins"][0]
        assert plugin["type"] == "plexus" and plugin["capabilities"] == {"portMappings": True}
        assert plugin["delegates"] == [primary] and plugin["socketDir"] == str(d.socket.parent)
        assert "metricsPort" not in plugin

        primary["plugins"][1]["capabilities"] = {"portMappings": True, "bandwidth": True}
        (net_d / "10-primary.conflist").write_text(json.dumps(primary))
        wait_for(
            lambda: "bandwidth" in json.loads(generated.read_text())["plugins"][0]["capabilities"],
            "the primary's new capability",
        )
    finally:
        d.stop()
    # A stopped daemon (restart, upgrade) keeps its config: no pod may start on the
    # primary network alone while it is away (multus-cni #1527, #1387).
    kept = generated.read_bytes()
    assert json.loads(kept)["plugins"][0]["delegates"] == [primary]
    before = generated.stat().st_ino
    d.start()
    try:
        with _file_calls(d, node.root / "strace-restarted.out") as calls:
            # Each sync reads ours to compare: after two reads, the first sync is done.
            wait_for(lambda: calls(generated) >= 2, "two syncs of the restarted daemon")
        assert generated.stat().st_ino == before  # the same file, not re-written
    finally:
        d.stop()
    removed = subprocess.run(
        [
            PLEXUS,
            "uninstall-cni",
            "--root",
            str(node.root),
            "--bin-dir",
            "/bin",
            "--cni-conf",
            "/net.d/00-plexus.conflist",
            "--state-dir",
            "/cni",
            "--state-dir",
            "/run",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"removed {generated}" in removed.splitlines()[0]  # the config goes first
    assert os.listdir(net_d) == ["10-primary.conflist"]
    assert not (node.bin / "plexus").exists() and not (node.bin / "plexus-thin").exists()
    assert not (node.root / "run").exists()
    assert (node.bin / "bridge").exists()  # other plugins stay


def _status_code(daemon: Daemon, path: str) -> int:
    try:
        return daemon.get(path)[0]
    except OSError:
        return 0


@contextmanager
def _file_calls(daemon: Daemon, out: Path) -> Iterator[Callable[[Path], int]]:
    """strace attached to the running daemon (all its threads); counts its file syscalls
    naming a path, seen since attaching. A sync that finds nothing to do leaves no other
    trace, so this is how a test knows one ran before it checks that nothing happened."""
    assert daemon.proc is not None  # `ip netns exec` execs the daemon: the same pid
    argv = ["strace", "-f", "-qq", "-e", "trace=%file", "-o", str(out), "-p", str(daemon.proc.pid)]
    strace = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    try:
        yield lambda path: out.read_text().count(f'"{path}"') if out.exists() else 0
    finally:
        strace.terminate()  # detaches; the daemon runs on
        strace.wait(timeout=30)


NESTED = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("where", ["stdin", "annotation", "nad"])
def test_input_nested_100000_levels_is_code_6_and_the_worker_lives(
    node: Node, daemon: Daemon, where: str
) -> None:
    """Such input once killed the worker thread (RecursionError) and the shim saw no answer."""
    node.nad("macvlan-net", node.macvlan_conf())
    node.nad("deep", '{"cniVersion": "1.0.0", "type": "macvlan", "x": ' + NESTED + "}")
    node.pod("deep", NESTED if where == "annotation" else "deep" if where == "nad" else "")
    netns = node.pod_netns()
    stdin = json.dumps(node.meta()).encode()
    if where == "stdin":
        stdin = stdin[:-1] + b', "x": ' + NESTED.encode() + b"}"
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c-deep",
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(node.bin),
        "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=deep",
    }
    exit_code, error = _raw(daemon, protocol.encode_request(env, stdin))

    assert exit_code == 1 and error["code"] == 6, error
    assert "is nested deeper than 64 levels" in error["msg"]
    assert node.links(netns) == ["lo"]
    node.pod("next", "macvlan-net")  # the worker slot came back: the next call is served
    fine = node.pod_netns()
    node.ok("ADD", netns=fine, cid="c-next", pod="next")
    assert node.links(fine) == ["eth0", "lo", "net1"]
