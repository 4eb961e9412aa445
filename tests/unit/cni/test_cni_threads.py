"""cni/threads.py: reused threads."""

from __future__ import annotations

import threading

from cni.threads import ReusedThreads

WAIT = 10.0


def test_threads_are_reused_and_a_busy_one_is_never_waited_for() -> None:
    threads = ReusedThreads("test", keep_idle=1)
    ran_on: list[int] = []
    done = threading.Semaphore(0)
    hold = threading.Event()

    def job() -> None:
        ran_on.append(threading.get_ident())
        done.release()

    threads.run(job)
    assert done.acquire(timeout=WAIT)
    for _ in range(int(WAIT * 100)):  # the thread files itself as idle after its job
        if threads.idle() == 1:
            break
        threading.Event().wait(0.01)

    def held() -> None:
        hold.wait(WAIT)
        job()

    threads.run(held)  # takes the idle thread
    threads.run(job)  # none idle: a new thread, not a wait for the held one
    assert done.acquire(timeout=WAIT)
    hold.set()
    assert done.acquire(timeout=WAIT)
    first, new, reused = ran_on
    assert reused == first and new != first
