"""Threads that are reused: handing a job to an idle one costs ~13-30 us, starting one
~0.4 ms (the caller waits for the new thread to run). Used by the daemon for each CNI
call, by meta/lanes.py for each call's side lane and by delegates/builtin.py for each
in-process plugin call (so that its caller can stop waiting at its deadline)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class ReusedThreads:
    """Each thread runs one job at a time; an idle one is reused, else a new one starts
    (nobody waits for a thread). At most `keep_idle` wait for work; past that, a thread
    whose job is done ends. A job handles its own errors."""

    def __init__(self, name: str, keep_idle: int) -> None:
        self.name = name
        self.keep_idle = keep_idle
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._lock = threading.Lock()

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name=self.name, daemon=True).start()
        inbox.put(job)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            inbox.get()()
            with self._lock:
                if len(self._idle) >= self.keep_idle:
                    return
                self._idle.append(inbox)
