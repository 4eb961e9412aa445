"""The daemon's background writer: API writes that must not hold a CNI call.

Events always go here; a network-status write comes here when the ADD's own bounded
attempt did not finish. An event waits EVENT_DELAY before it goes, so the call that
queued it answers without sharing the interpreter with its sending (measured: ~1 ms of a
one-secondary ADD). One thread sends them in order (statuses first), back to back
over the API client's kept-alive connection, and retries with backoff while the API
server is away. A pod's status writes coalesce (the latest value wins). At most
`capacity` writes wait: past that a new event is dropped, and a status write evicts the
newest event (a lost event costs less than a pod without its network-status). Every
write given up on (queue full, retried for too long, refused by the server) is counted
through `on_drop`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from cni.errors import CNIError, ErrorCode
from kube.api import APIError

log = logging.getLogger("plexus.kube")

RETRY_FOR_SECONDS = 300.0
MAX_BACKOFF_SECONDS = 10.0
EVENT_DELAY = 0.05


@dataclass(eq=False)
class Write:
    """One API write: `send(timeout)` makes one attempt, raising APIError or OSError."""

    kind: str  # "status" or "event": the metric label
    what: str  # for logs: "network-status of ns/name"
    send: Callable[[float], None]
    deadline: float = field(default_factory=lambda: time.monotonic() + RETRY_FOR_SECONDS)
    not_before: float = 0.0  # monotonic time before which it is not sent


def retriable(exc: Exception) -> bool:
    """Worth another try: the server was unreachable, overloaded or failing."""
    return not isinstance(exc, APIError) or exc.status >= 500 or exc.status == 429


def _gone(exc: Exception) -> bool:
    """The object is gone (404), or its UID precondition failed: it was deleted and made
    again under its name."""
    if not isinstance(exc, APIError):
        return False
    return exc.status == 404 or (exc.status == 422 and "metadata.uid" in str(exc))


def write_bounded(
    write: Write, key: Hashable, timeout: float, writer: BackgroundWriter | None
) -> None:
    """One attempt within `timeout`, for a write that is part of a CNI call.

    An object gone is not an error (logged); a server that did not answer in time, is
    away or failing hands the write to `writer` (the call succeeds), or without one
    (thin mode) is code 11; any other refusal is code 5.
    """
    try:
        write.send(timeout)
    except (APIError, OSError) as exc:
        if _gone(exc):
            log.warning("object gone or replaced; not written", extra={"what": write.what})
            return
        if not retriable(exc):
            raise CNIError(ErrorCode.IO_FAILURE, f"writing {write.what} failed", str(exc)) from exc
        if writer is None:
            raise CNIError(
                ErrorCode.TRY_AGAIN_LATER, f"writing {write.what} failed", str(exc)
            ) from exc
        writer.put_status(key, write)
        log.warning(
            "write not done within the bound; queued",
            extra={"what": write.what, "bound_s": timeout, "error": str(exc)},
        )
        return
    if writer is not None:
        writer.discard_status(key)  # an older value still queued must not land later


class BackgroundWriter:
    """A bounded queue of API writes and the thread that sends them."""

    def __init__(self, capacity: int, timeout: float) -> None:
        self.capacity = capacity
        self.timeout = timeout  # of one background attempt
        self.on_drop: Callable[[str, str], None] = lambda kind, reason: None
        self._statuses: dict[Hashable, Write] = {}
        self._events: deque[Write] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="kube-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def depth(self) -> int:
        """Writes waiting (the one being sent included)."""
        with self._cond:
            return len(self._statuses) + len(self._events)

    def put_event(self, write: Write) -> None:
        with self._cond:
            if len(self._statuses) + len(self._events) >= self.capacity:
                self._drop(write, "full")
                return
            write.not_before = time.monotonic() + EVENT_DELAY
            self._events.append(write)
            self._cond.notify()

    def put_status(self, key: Hashable, write: Write) -> None:
        """Queue a status write; one already waiting under `key` is replaced by it."""
        with self._cond:
            if key not in self._statuses and len(self._statuses) + len(self._events) >= (
                self.capacity
            ):
                if not self._events:
                    self._drop(write, "full")
                    return
                self._drop(self._events.pop(), "full")
            self._statuses[key] = write
            self._cond.notify()

    def discard_status(self, key: Hashable) -> None:
        """Forget a queued status write that a newer one, already written, supersedes."""
        with self._cond:
            self._statuses.pop(key, None)

    def close(self, grace: float) -> None:
        """Give waiting writes up to `grace` seconds, then stop."""
        deadline = time.monotonic() + grace
        with self._cond:
            while (self._statuses or self._events) and time.monotonic() < deadline:
                self._cond.wait(0.05)
            left = len(self._statuses) + len(self._events)
            self._stopped = True
            self._cond.notify_all()
        if left:
            log.warning("stopping with API writes unsent", extra={"writes": left})

    def _run(self) -> None:
        delay = 0.0
        while True:
            with self._cond:
                while not self._stopped and not (self._statuses or self._events):
                    self._cond.wait()
                if self._stopped:
                    return
                write = next(iter(self._statuses.values()), None) or self._events[0]
                early = write.not_before - time.monotonic()
                if early > 0:
                    self._cond.wait(early)  # a status write or stop() wakes it sooner
                    continue
            if time.monotonic() > write.deadline:
                self._done(write, "expired")
                continue
            try:
                write.send(self.timeout)
            except (APIError, OSError) as exc:
                if retriable(exc):
                    delay = min(max(delay * 2, 0.5), MAX_BACKOFF_SECONDS)
                    self._note_failure(write, exc, delay)
                    with self._cond:
                        self._cond.wait_for(lambda: self._stopped, delay)
                    continue
                gone = isinstance(exc, APIError) and exc.status == 404
                self._done(write, "gone" if gone else "rejected", exc)
                continue
            delay = 0.0
            if self._failing:
                self._failing = False
                log.info("API writes resumed", extra={"what": write.what, "waiting": self.depth()})
            self._done(write, "")

    def _note_failure(self, write: Write, exc: Exception, delay: float) -> None:
        if not self._failing:  # one line per outage, not one per attempt
            self._failing = True
            log.warning(
                "API server unavailable; writes wait in the background queue",
                extra={"what": write.what, "error": str(exc), "retry_in": delay},
            )

    def _done(self, write: Write, dropped: str, exc: Exception | None = None) -> None:
        """Take `write` off the queue (unless it was replaced meanwhile); count a drop."""
        with self._cond:
            for key, queued in list(self._statuses.items()):
                if queued is write:
                    del self._statuses[key]
            if self._events and self._events[0] is write:
                self._events.popleft()
            if dropped:
                self._drop(write, dropped, exc)
            self._cond.notify_all()

    def _drop(self, write: Write, reason: str, exc: Exception | None = None) -> None:
        error = {"error": str(exc)} if exc else {}
        level = logging.INFO if reason == "gone" else logging.WARNING
        log.log(level, "API write dropped", extra={"what": write.what, "reason": reason, **error})
        self.on_drop(write.kind, reason)
