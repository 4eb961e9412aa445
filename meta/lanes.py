"""Attach a pod's networks in two lanes: Plexus's own delegates beside the exec'd plugins.

Multus attaches a pod's networks one after another. Plexus's in-process delegates
(macvlan, ipvlan, sriov) each touch only the interface they create, the host link it
hangs from and their IPAM's state (locked per network), so each runs on a thread of
the shared pool while the exec'd plugins (the default network, third-party secondaries)
run in order on the calling thread. What depends on order stays in order:
- a network whose plugins are not all in-process keeps its place in the sequence;
- one that names a link inside the pod (`linkInContainer`) first waits for every
  network before it, in both lanes;
- results, network-status and rollback follow the networks' order, whatever finished
  first; when one fails, networks not yet started are not started.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass

from cni.errors import CNIError
from cni.pools import shared_pool
from cni.result import Result
from meta.delegate import Delegate

POOL_SIZE = 4
"""Threads for the side lane of all calls together; under the GIL more would only queue."""


@dataclass
class Outcome:
    """What one attach pass did: a result per network, or the first failure by order."""

    results: list[Result]
    started: list[Delegate]
    """In order: the networks that ran, failed ones included (their DEL is the rollback)."""
    error: CNIError | None = None


def attach_in_lanes(
    delegates: Sequence[Delegate],
    attach: Callable[[Delegate], Result],
    beside: Callable[[Delegate], bool],
) -> Outcome:
    """Run `attach` on every delegate; those `beside` says may run on the side lane do."""
    pool = shared_pool("attach", POOL_SIZE)
    side: dict[int, Future[Result]] = {}
    for index, delegate in enumerate(delegates):
        if beside(delegate):
            context = contextvars.copy_context()  # the call's scope: timeouts, cancellation
            side[index] = pool.submit(context.run, attach, delegate)
    done: dict[int, Result] = {}
    failed: dict[int, CNIError] = {}
    ran: set[int] = set()
    for index, delegate in enumerate(delegates):
        if index in side:
            continue
        if delegate.links_in_pod:
            wait([f for i, f in side.items() if i < index])
        if failed or _side_failed(side):
            break
        ran.add(index)
        try:
            done[index] = attach(delegate)
        except CNIError as exc:
            failed[index] = exc
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


def _side_failed(side: dict[int, Future[Result]]) -> bool:
    return any(f.done() and not f.cancelled() and f.exception() for f in side.values())
