"""The engine's own rules, driven through fake recorder plugins (see tests/unit/conftest.py).

The real-namespace behaviour (rollback, DEL without records, CHECK, GC of real
attachments) is in tests/netns; here: error aggregation, DEL retries, readiness and the
GC lock, which need plugins that fail on demand.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cni import fileio
from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from meta import node as node_module
from meta.config import MetaConfig
from meta.engine import Engine
from meta.plugin import MetaPlugin
from tests.unit.conftest import Recorder
from tests.wait import wait_for

CID = "engine-test-1"
FLOCK = {"x86_64": 73, "aarch64": 32}[os.uname().machine]  # flock(2)'s syscall number


def _in_flock(thread: threading.Thread, path: Path) -> bool:
    """True while `thread` is blocked in flock(2) on `path` (/proc shows the syscall's
    number and arguments, the first the file descriptor)."""
    try:
        number, fd, *_ = Path(f"/proc/self/task/{thread.native_id}/syscall").read_text().split()
        return int(number) == FLOCK and os.readlink(f"/proc/self/fd/{int(fd, 16)}") == str(path)
    except (OSError, ValueError):  # running, or the thread or fd is gone
        return False


def engine_for(tmp_path: Path, bin_dir: Path, types: list[str], **keys: Any) -> Engine:
    conf = MetaConfig.model_validate(
        {
            "cniVersion": "1.0.0",
            "name": "plexus",
            "type": "plexus",
            "cniDir": str(tmp_path / "cni"),
            "delegates": [{"cniVersion": "1.0.0", "name": t, "type": t} for t in types],
            **keys,
        }
    )
    return MetaPlugin(configure_logging=False).engine_for(conf, [str(bin_dir)])


def cmd(verb: str, container_id: str = CID) -> CmdArgs:
    return CmdArgs(verb, container_id, "/proc/self/ns/net", "eth0", (), (), b"")


def verbs(recorder: Recorder) -> list[str]:
    return [c["env"]["CNI_COMMAND"] for c in recorder.calls() if c["plugin"] == recorder.name]


def test_del_reports_every_failing_network_and_keeps_the_record(
    tmp_path: Path, bin_dir: Path, make_recorder_plugin: Callable[..., Recorder]
) -> None:
    make_recorder_plugin("first", fail=("DEL",))
    make_recorder_plugin("second", fail=("DEL",))
    engine = engine_for(tmp_path, bin_dir, ["first", "second"])
    engine.add(cmd("ADD"))

    with pytest.raises(CNIError) as raised:
        engine.delete(cmd("DEL"))

    assert raised.value.code == ErrorCode.TRY_AGAIN_LATER
    assert raised.value.msg == "DEL failed for 2 network(s)"
    assert raised.value.details == (
        'second (net1, second): plugin "second" failed (del): recorder says no: DEL; '
        'first (eth0, first): plugin "first" failed (del): recorder says no: DEL'
    )
    assert engine.node.records.load(CID) is not None, "a failed DEL must be retried later"


@pytest.mark.parametrize(("retry", "attempts"), [(False, 1), (True, 2)])
def test_retry_delete_on_error_tries_a_failing_del_twice(
    tmp_path: Path,
    bin_dir: Path,
    make_recorder_plugin: Callable[..., Recorder],
    retry: bool,
    attempts: int,
) -> None:
    failing = make_recorder_plugin("failing", fail=("DEL",))
    engine = engine_for(tmp_path, bin_dir, ["failing"], retryDeleteOnError=retry)
    engine.add(cmd("ADD"))

    with pytest.raises(CNIError):
        engine.delete(cmd("DEL"))

    assert verbs(failing) == ["ADD"] + ["DEL"] * attempts


def test_add_waits_for_the_readiness_indicator_then_gives_up(
    tmp_path: Path,
    bin_dir: Path,
    recorder: Recorder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(node_module, "READINESS_WAIT_SECONDS", 0.3)
    indicator = tmp_path / "ready"
    engine = engine_for(tmp_path, bin_dir, ["recorder"], readinessindicatorfile=str(indicator))

    with pytest.raises(CNIError) as raised:
        engine.add(cmd("ADD"))
    assert raised.value.code == ErrorCode.TRY_AGAIN_LATER
    assert str(indicator) in raised.value.msg
    assert recorder.calls() == [], "no delegate may run before the default network is ready"

    monkeypatch.setattr(node_module, "READINESS_WAIT_SECONDS", 30)
    timer = threading.Timer(0.2, indicator.touch)
    timer.start()
    engine.add(cmd("ADD"))
    timer.join()
    assert verbs(recorder) == ["ADD"]


def test_gc_waits_for_calls_in_flight(tmp_path: Path, bin_dir: Path, recorder: Recorder) -> None:
    engine = engine_for(tmp_path, bin_dir, ["recorder"])
    engine.add(cmd("ADD"))
    done = threading.Event()

    def gc() -> None:
        engine.gc(cmd("GC", ""))
        done.set()

    with engine.node.lock("another-container"):
        thread = threading.Thread(target=gc)
        thread.start()
        lock = tmp_path / "cni" / "gc.lock"
        wait_for(lambda: done.is_set() or _in_flock(thread, lock), "GC at the node lock")
        assert not done.is_set(), "GC ran while another call held the node"
    assert done.wait(10)
    thread.join()
    assert "DEL" in verbs(recorder), "the record not in the (empty) valid list is DELed"
    assert engine.node.records.load(CID) is None


def test_a_failed_add_leaves_no_cache_file_its_background_write_made_late(
    tmp_path: Path,
    bin_dir: Path,
    make_recorder_plugin: Callable[..., Recorder],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cache files are written off the calling thread; the rollback's DEL must come after
    the write, or the file would be written after its DEL and outlive the container."""
    make_recorder_plugin("first")
    make_recorder_plugin("failing", fail=("ADD",))
    write_atomic = fileio.write_atomic
    writes = {"started": 0, "done": 0}

    def slow(*args: Any, **kwargs: Any) -> None:
        writes["started"] += 1
        threading.Event().wait(0.3)
        write_atomic(*args, **kwargs)
        writes["done"] += 1

    monkeypatch.setattr(fileio, "write_atomic", slow)
    engine = engine_for(tmp_path, bin_dir, ["first", "failing"])

    with pytest.raises(CNIError):
        engine.add(cmd("ADD"))
    wait_for(lambda: writes["started"] and writes["done"] == writes["started"], "the late writes")

    assert list((tmp_path / "cni" / "results").iterdir()) == []
