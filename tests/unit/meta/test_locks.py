"""Container locks across processes: a lock file removed by its holder never lets two in."""

from __future__ import annotations

import fcntl
import threading
from contextlib import ExitStack
from pathlib import Path

import pytest

from meta.locks import file_lock, remove_lock_file


def test_a_waiter_on_a_removed_lock_file_locks_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c1"
    real_flock = fcntl.flock
    waiter_calls: list[threading.Event] = [threading.Event(), threading.Event()]

    def flock(fd: int, op: int) -> None:
        if threading.current_thread().name == "waiter":
            next(e for e in waiter_calls if not e.is_set()).set()
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)  # the one meta.locks calls
    entered = {name: threading.Event() for name in ("waiter", "newcomer")}
    leave = {name: threading.Event() for name in ("waiter", "newcomer")}

    def hold() -> None:
        name = threading.current_thread().name
        with file_lock(path):
            entered[name].set()
            assert leave[name].wait(30)

    threads = {name: threading.Thread(target=hold, name=name) for name in entered}
    with ExitStack() as holder:
        holder.enter_context(file_lock(path))
        threads["waiter"].start()
        assert waiter_calls[0].wait(30)  # the waiter has the old file open, and waits
        remove_lock_file(path)  # as DEL does, still holding the lock
        threads["newcomer"].start()
        assert entered["newcomer"].wait(30)  # a new file: free
    # The holder is gone: the waiter gets the removed file's lock, sees it was removed,
    # and waits for the new file's, which the newcomer holds.
    assert waiter_calls[1].wait(30)
    assert not entered["waiter"].is_set()
    leave["newcomer"].set()
    assert entered["waiter"].wait(30)
    leave["waiter"].set()
    for thread in threads.values():
        thread.join(30)
    assert path.exists()  # the waiter's: nobody removed it
