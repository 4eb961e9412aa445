"""The daemon's background API writer: coalescing, bounds, drops, retries."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from kube import writes
from kube.api import APIError
from kube.writes import BackgroundWriter, Write
from tests.wait import wait_for


@pytest.fixture
def drops() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def writer(drops: list[tuple[str, str]]) -> Iterator[BackgroundWriter]:
    w = BackgroundWriter(capacity=3, timeout=1.0)
    w.on_drop = lambda kind, reason: drops.append((kind, reason))
    yield w
    w.close(0)


def _write(
    kind: str, log: list[str], name: str, fail: Callable[[], object] = lambda: None
) -> Write:
    def send(timeout: float) -> None:
        fail()
        log.append(name)

    return Write(kind, name, send)


def test_a_pods_status_writes_coalesce_to_the_latest(writer: BackgroundWriter) -> None:
    sent: list[str] = []
    writer.put_status(("ns", "p"), _write("status", sent, "old"))
    writer.put_status(("ns", "p"), _write("status", sent, "new"))
    assert writer.depth() == 1
    writer.start()
    wait_for(lambda: writer.depth() == 0, "an empty queue")
    assert sent == ["new"]


def test_statuses_go_first_then_events_in_order(writer: BackgroundWriter) -> None:
    sent: list[str] = []
    writer.put_event(_write("event", sent, "e1"))
    writer.put_event(_write("event", sent, "e2"))
    writer.put_status(("ns", "p"), _write("status", sent, "s"))
    writer.start()
    wait_for(lambda: writer.depth() == 0, "an empty queue")
    assert sent == ["s", "e1", "e2"]


def test_an_event_waits_its_delay(
    writer: BackgroundWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writes, "EVENT_DELAY", 0.3)
    sent_at: list[float] = []
    writer.start()
    queued_at = time.monotonic()
    writer.put_event(Write("event", "e", lambda timeout: sent_at.append(time.monotonic())))
    wait_for(lambda: sent_at, "the event sent")
    assert sent_at[0] - queued_at >= writes.EVENT_DELAY


def test_a_status_queued_while_an_event_waits_goes_first(
    writer: BackgroundWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writes, "EVENT_DELAY", 60.0)  # longer than this test
    sent: list[str] = []
    writer.start()
    writer.put_event(_write("event", sent, "e"))
    writer.put_status(("ns", "p"), _write("status", sent, "s"))
    wait_for(lambda: sent == ["s"], "the status sent")
    assert writer.depth() == 1  # the event still waits


def test_full_queue_drops_events_and_a_status_evicts_the_newest_event(
    writer: BackgroundWriter, drops: list[tuple[str, str]]
) -> None:
    sent: list[str] = []
    for name in ("e1", "e2", "e3", "e4"):
        writer.put_event(_write("event", sent, name))
    assert drops == [("event", "full")]
    writer.put_status(("ns", "p"), _write("status", sent, "s"))
    writer.put_status(("ns", "q"), _write("status", sent, "t"))
    writer.put_status(("ns", "r"), _write("status", sent, "u"))
    writer.put_status(("ns", "x"), _write("status", sent, "v"))
    assert drops == [("event", "full")] * 4 + [("status", "full")]
    writer.start()
    wait_for(lambda: writer.depth() == 0, "an empty queue")
    assert sent == ["s", "t", "u"]


def test_unreachable_server_is_retried_until_it_answers(writer: BackgroundWriter) -> None:
    sent: list[str] = []
    failures = [ConnectionError("refused"), APIError(503, "unavailable")]

    def fail() -> None:
        if failures:
            raise failures.pop(0)

    writer.put_event(_write("event", sent, "e", fail))
    writer.start()
    wait_for(lambda: sent == ["e"], "the event sent")
    assert writer.depth() == 0


@pytest.mark.parametrize(("status", "reason"), [(403, "rejected"), (404, "gone")])
def test_refused_writes_are_not_retried(
    writer: BackgroundWriter, drops: list[tuple[str, str]], status: int, reason: str
) -> None:
    attempts: list[str] = []

    def fail() -> None:
        attempts.append("try")
        raise APIError(status, "no")

    writer.put_event(_write("event", [], "e", fail))
    writer.start()
    wait_for(lambda: writer.depth() == 0, "an empty queue")
    assert attempts == ["try"] and drops == [("event", reason)]


def test_writes_past_their_deadline_expire(
    writer: BackgroundWriter, drops: list[tuple[str, str]]
) -> None:
    sent: list[str] = []
    stale = _write("event", sent, "stale")
    stale.deadline = time.monotonic() - 1
    writer.put_event(stale)
    writer.start()
    wait_for(lambda: writer.depth() == 0, "an empty queue")
    assert sent == [] and drops == [("event", "expired")]


def test_close_gives_waiting_writes_their_grace(writer: BackgroundWriter) -> None:
    sent: list[str] = []
    gate = threading.Event()
    writer.put_event(_write("event", sent, "e", lambda: gate.wait(5)))
    writer.start()
    threading.Timer(0.2, gate.set).start()
    writer.close(10)
    assert sent == ["e"]
