"""Attach a pod's networks in two lanes: Plexus's own delegates beside the exec'd plugins.

Multus attaches a pod's networks one after another. Plexus's in-process delegates
(macvlan, ipvlan, sriov) each touch only the interface they create, the host link it
hangs from and their IPAM's state (locked per network), so they run, in order, on a
thread of the call's own while the exec'd plugins (the default network, third-party
secondaries) run in order on the calling thread. A call's side lane has its thread to
itself, so a delegate that hangs holds up only its own pod; threads are reused
(cni/threads.py).
What depends on order stays in order:
- a network whose plugins are not all in-process keeps its place in the sequence;
- one that names a link inside the pod (`linkInContainer`) first waits for every
  network before it, in both lanes;
- results, network-status and rollback follow the networks' order, whatever finished
  first; when one fails, networks not yet started are not started.

The side lane starts once the calling thread's first plugin has been exec'd and has its
config on stdin (or the calling thread has nothing to exec, or HEAD_START has passed):
before that the two would take turns at the interpreter, and the exec'd default network,
usually the longest of all, would start later (a Go plugin reads its stdin well within
1 ms of its exec: docs/performance.md).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass

from cni import callscope
from cni.errors import CNIError
from cni.result import Result
from cni.threads import ReusedThreads
from meta.delegate import Delegate

BESIDE = "beside"
IN_ORDER = "in order"
"""The lanes, as `attach` is told (the engine logs them with each delegate's ADD)."""

HEAD_START = 0.01
"""Seconds at most that the side lane waits for the calling thread's first exec."""

Attach = Callable[[Delegate, str], Result]


@dataclass
class Outcome:
    """What one attach pass did: a result per network, or the first failure by order."""

    results: list[Result]
    started: list[Delegate]
    """In order: the networks that ran, failed ones included (their DEL is the rollback)."""
    error: CNIError | None = None


def attach_in_lanes(
    delegates: Sequence[Delegate],
    attach: Attach,
    beside: Callable[[Delegate], bool],
) -> Outcome:
    """Run `attach` on every delegate; those `beside` says may run on the side lane do."""
    side = {i: Future[Result]() for i, d in enumerate(delegates) if beside(d)}
    go = threading.Event()
    if side:
        callscope.current().watch_next_exec(go)
        work = [(side[i], delegates[i]) for i in sorted(side)]
        context = contextvars.copy_context()  # the call's scope: timeouts, cancellation
        _threads.run(lambda: context.run(_side_lane, work, attach, go))
    done: dict[int, Result] = {}
    failed: dict[int, CNIError] = {}
    ran: set[int] = set()
    for index, delegate in enumerate(delegates):
        if index in side:
            continue
        if delegate.links_in_pod:
            go.set()
            wait([f for i, f in side.items() if i < index])
        if failed or _side_failed(side):
            break
        ran.add(index)
        try:
            done[index] = attach(delegate, IN_ORDER)
        except CNIError as exc:
            failed[index] = exc
    go.set()
    for index, future in side.items():
        if (failed or _side_failed(side)) and future.cancel():
            continue
        ran.add(index)
        try:
            done[index] = future.result()
        except CNIError as exc:
            failed[index] = exc
    started = [d for i, d in enumerate(delegates) if i in ran]
    if failed:
        return Outcome([], started, failed[min(failed)])
    return Outcome([done[i] for i in range(len(delegates))], started)


_threads = ReusedThreads("attach-side", keep_idle=16)


def _side_lane(
    work: list[tuple[Future[Result], Delegate]], attach: Attach, go: threading.Event
) -> None:
    """Once `go` is set (or HEAD_START has passed), attach each network in order; after
    a failure, cancel the rest."""
    go.wait(HEAD_START)
    failed = False
    for future, delegate in work:
        if failed:
            future.cancel()
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(attach(delegate, BESIDE))
        except BaseException as exc:  # handed to the calling thread, which raises it
            future.set_exception(exc)
            failed = True


def _side_failed(side: dict[int, Future[Result]]) -> bool:
    return any(f.done() and not f.cancelled() and f.exception() for f in side.values())
