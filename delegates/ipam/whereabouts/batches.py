"""Changes to one pool made by concurrent calls, written together: group commit.

While a patch of a pool is in flight, the changes this process's other calls make to it
wait; then one of them writes all that waited in one JSON patch (each change's test, then
its add or remove), which the API server applies whole or not at all. A burst's writes
to a pool come down from one per pod to a few per node, and the API server no longer
re-applies dozens of concurrent patches of one object against each other (its retries
are capped: past them it answers 409, and each retry re-reads and re-encodes the pool).

A failed test (422) is sorted out by reading the pool afresh: the changes whose key no
longer holds what they expected are refused (Taken) and the others go again. A 409 (the
API server's own retry cap) is tried again as it is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from delegates.ipam.whereabouts.objects import Pool, Taken

CONFLICT_RETRIES = 5


class Busy(Exception):
    """The API server gave up on a patch for concurrent writers of the object (409)."""


@dataclass(eq=False)
class Change:
    """One key of `spec.allocations`: from `before` (None: absent) to `after` (None:
    removed); the pool as written once done, or the error."""

    key: str
    before: Any
    after: Any
    pool: Pool | None = None
    error: BaseException | None = None
    done: bool = False

    def ops(self) -> list[dict[str, Any]]:
        path = f"/spec/allocations/{self.key}"
        ops: list[dict[str, Any]] = [{"op": "test", "path": path, "value": self.before}]
        if self.after is None:
            ops.append({"op": "remove", "path": path})
        else:
            ops.append({"op": "add", "path": path, "value": self.after})
        return ops


class Batches:
    """Group commit over `send(pool, ops)` (the patched pool; Taken on 422, Busy on 409,
    None when the pool is gone) and `read(pool)` (the pool now, None if gone)."""

    def __init__(
        self,
        send: Callable[[str, list[dict[str, Any]]], Pool | None],
        read: Callable[[str], Pool | None],
    ) -> None:
        self._send = send
        self._read = read
        self._pending: dict[str, list[Change]] = {}
        self._writing: set[str] = set()
        self._cond = threading.Condition()

    def write(self, name: str, change: Change) -> Pool:
        """Apply `change` to pool `name` (with whatever else waits for it); the pool as
        written, Taken if the key no longer held `change.before`."""
        with self._cond:
            self._pending.setdefault(name, []).append(change)
            while not change.done and name in self._writing:
                self._cond.wait()
            batch: list[Change] = []
            if not change.done:
                self._writing.add(name)
                batch = self._pending.pop(name)
        if batch:
            try:
                self._commit(name, batch)
            finally:
                with self._cond:
                    for c in batch:
                        c.done = True
                    self._writing.discard(name)
                    self._cond.notify_all()
        if change.error is not None:
            raise change.error
        assert change.pool is not None
        return change.pool

    def _commit(self, name: str, batch: list[Change]) -> None:
        busy = 0
        while batch:
            try:
                pool = self._send(name, [op for c in batch for op in c.ops()])
            except Taken as exc:
                batch = self._sort_out(name, batch, exc)
                continue
            except Busy as exc:
                busy += 1
                if busy < CONFLICT_RETRIES:
                    continue
                _fail(batch, Taken(f"{name}: {exc}"))
                return
            except BaseException as exc:
                _fail(batch, exc)
                return
            if pool is None:
                _fail(batch, Taken(f"{name} is gone"))
                return
            for c in batch:
                c.pool = pool
            return

    def _sort_out(self, name: str, batch: list[Change], exc: Taken) -> list[Change]:
        """After a failed test: refuse the changes whose key changed; the rest go again
        (none, if the refusal was not theirs to explain)."""
        try:
            fresh = self._read(name)
        except BaseException as err:
            _fail(batch, err)
            return []
        stale = [c for c in batch if fresh is None or fresh.allocations.get(c.key) != c.before]
        _fail(stale, exc)
        if not stale:
            _fail(batch, exc)
            return []
        return [c for c in batch if c not in stale]


def _fail(changes: list[Change], exc: BaseException) -> None:
    for c in changes:
        c.error = exc
