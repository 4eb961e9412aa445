"""delegates.netns.run_in_netns on real namespaces: the calling thread goes in and comes
back, whatever the function does."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from collections.abc import Callable

import pytest

from cni.errors import CNIError, ErrorCode
from delegates.netns import Where, here, run_in_netns, run_where
from tests.netns.conftest import Node, sh


def _here() -> int:
    """The inode of this thread's network namespace."""
    return os.stat("/proc/thread-self/ns/net").st_ino


def _node_ns(node: Node) -> int:
    return os.stat(f"/run/netns/{node.name}").st_ino


def test_runs_on_this_thread_inside_and_returns_home(node: Node) -> None:
    home = _here()
    seen = run_in_netns(f"/run/netns/{node.name}", lambda: (threading.get_ident(), _here()))
    assert seen == (threading.get_ident(), _node_ns(node))
    assert _here() == home


def test_returns_home_when_the_function_raises(node: Node) -> None:
    home = _here()

    def fail() -> None:
        raise ValueError(f"inside {_here()}")

    with pytest.raises(ValueError, match=f"inside {_node_ns(node)}"):
        run_in_netns(f"/run/netns/{node.name}", fail)
    assert _here() == home


def test_nested_entries_unwind_one_by_one(node: Node) -> None:
    pod = node.pod_netns()
    home = _here()

    def outer() -> tuple[int, int]:
        inner = run_in_netns(pod, _here)
        return inner, _here()

    inner, after_inner = run_in_netns(f"/run/netns/{node.name}", outer)
    assert inner == os.stat(pod).st_ino
    assert after_inner == _node_ns(node)
    assert _here() == home


def test_processes_started_inside_run_there(node: Node) -> None:
    out = run_in_netns(
        f"/run/netns/{node.name}",
        lambda: subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True),
    )
    assert "uplink0" in out.stdout
    assert "uplink0" not in sh("ip", "-o", "link", "show").stdout


def test_a_missing_namespace_is_code_3_and_leaves_the_thread_alone() -> None:
    home = _here()
    with pytest.raises(CNIError) as err:
        run_in_netns("/run/netns/pxt-no-such-ns", _here)
    assert err.value.code == ErrorCode.UNKNOWN_CONTAINER
    assert _here() == home


def test_run_where_runs_in_the_askers_namespace_and_keeps_its_thread_home(node: Node) -> None:
    """A reused thread born inside a pod's namespace (its creator was there) runs each
    job in the namespace of the thread that asks, and is in the process's own between
    jobs: it neither runs a job in a stale namespace nor keeps a deleted one alive."""
    home, pod = _here(), node.pod_netns()
    jobs: queue.SimpleQueue[tuple[Where, Callable[[], int]] | None] = queue.SimpleQueue()
    seen: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()

    def worker() -> None:
        seen.put((_here(), 0))
        while (job := jobs.get()) is not None:
            seen.put((run_where(*job), _here()))

    thread = run_in_netns(pod, lambda: threading.Thread(target=worker, daemon=True))
    run_in_netns(pod, thread.start)
    assert seen.get(timeout=10) == (os.stat(pod).st_ino, 0)
    jobs.put((here(), _here))
    assert seen.get(timeout=10) == (home, home)

    def ask_from_inside() -> tuple[int, int]:
        jobs.put((here(), _here))
        return seen.get(timeout=10)

    assert run_in_netns(f"/run/netns/{node.name}", ask_from_inside) == (_node_ns(node), home)
    jobs.put(None)
    thread.join(10)
