"""meta/lanes.py: which networks run beside the others, and what a failure stops.

`attach` here is a test function standing in for the engine's delegate ADD (the real
ones run in tests/netns); it records the order of starts and can block on a gate, which
is how these tests see two lanes overlap without measuring time.
"""

from __future__ import annotations

import contextvars
import subprocess
import threading
from collections.abc import Callable

import pytest

from cni import callscope
from cni.errors import CNIError, ErrorCode
from cni.result import Result
from meta import lanes
from meta.delegate import Delegate

WAIT = 10.0
"""Seconds a gate waits before the test fails instead of hanging."""


def delegate(name: str, **plugin: object) -> Delegate:
    return Delegate(network=name, ifname=name, config={"name": name, "type": "t", **plugin})


def beside_if(*names: str) -> Callable[[Delegate], bool]:
    return lambda d: d.network in names


class Attach:
    """Records starts; `fail` names networks whose ADD fails; `gates` holds an ADD
    until its event is set."""

    def __init__(self, fail: tuple[str, ...] = (), gates: dict[str, threading.Event] | None = None):
        self.fail = fail
        self.gates = gates or {}
        self.started: list[str] = []
        self.lanes: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, d: Delegate, lane: str) -> Result:
        with self._lock:
            self.started.append(d.network)
            self.lanes[d.network] = lane
        gate = self.gates.get(d.network)
        if gate is not None and not gate.wait(WAIT):
            raise AssertionError(f"{d.network}: gate never opened")
        if d.network in self.fail:
            raise CNIError(ErrorCode.IO_FAILURE, f"{d.network} failed")
        return Result(cniVersion="1.0.0", interfaces=[{"name": d.ifname}])


def names(results: list[Result]) -> list[str]:
    return [r.interfaces[0].name for r in results]


def test_a_side_network_runs_while_the_exec_lane_is_busy() -> None:
    side_done = threading.Event()
    gate = threading.Event()

    class Lane(Attach):
        def __call__(self, d: Delegate, lane: str) -> Result:
            if d.network == "eth0":
                # The default network's ADD finishes only once net1 has run beside it.
                assert side_done.wait(WAIT), "net1 did not run while eth0 was running"
                gate.set()
            result = super().__call__(d, lane)
            if d.network == "net1":
                side_done.set()
            return result

    attach = Lane()
    outcome = lanes.attach_in_lanes([delegate("eth0"), delegate("net1")], attach, beside_if("net1"))

    assert outcome.error is None
    assert names(outcome.results) == ["eth0", "net1"]
    assert gate.is_set()
    assert attach.lanes == {"eth0": lanes.IN_ORDER, "net1": lanes.BESIDE}


def test_the_side_lane_starts_once_the_calling_thread_s_plugin_has_its_stdin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lanes, "HEAD_START", WAIT * 3)  # only the exec can start it
    side_started = threading.Event()
    seen: list[bool] = []

    def attach(d: Delegate, lane: str) -> Result:
        if d.network == "net1":
            side_started.set()
        if d.network == "eth0":
            seen.append(side_started.is_set())
            with subprocess.Popen(["true"]) as proc, callscope.current().running(proc, "ADD"):
                seen.append(side_started.wait(WAIT))  # exec'd, not fed yet
                callscope.current().fed()
                seen.append(side_started.wait(WAIT))
        return Attach()(d, lane)

    with callscope.call_scope():
        outcome = lanes.attach_in_lanes(
            [delegate("eth0"), delegate("net1")], attach, beside_if("net1")
        )

    assert outcome.error is None
    assert seen == [False, False, True]


def test_without_an_exec_the_side_lane_starts_when_the_calling_thread_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lanes, "HEAD_START", WAIT * 3)
    attach = Attach()

    with callscope.call_scope():
        outcome = lanes.attach_in_lanes(
            [delegate("eth0"), delegate("net1"), delegate("net2")], attach, beside_if("net1")
        )

    assert outcome.error is None
    assert attach.started == ["eth0", "net2", "net1"]


def test_results_keep_the_networks_order_whatever_finishes_first() -> None:
    late = threading.Event()
    attach = Attach(gates={"net1": late})
    nets = [delegate("net1"), delegate("eth0"), delegate("net2")]

    def release_net1_last(d: Delegate, lane: str) -> Result:
        result = attach(d, lane)
        if d.network == "eth0":
            late.set()
        return result

    outcome = lanes.attach_in_lanes(nets, release_net1_last, beside_if("net1", "net2"))

    assert names(outcome.results) == ["net1", "eth0", "net2"]
    assert [d.network for d in outcome.started] == ["net1", "eth0", "net2"]


def test_every_side_network_completes_after_the_exec_lane_is_done() -> None:
    """Side networks still queued when the exec lane ends run (they are not cancelled)."""
    nets = [delegate("eth0")] + [delegate(f"net{i}") for i in range(12)]
    outcome = lanes.attach_in_lanes(nets, Attach(), lambda d: d.network != "eth0")

    assert outcome.error is None
    assert names(outcome.results) == [d.network for d in nets]


def test_a_link_in_the_pod_waits_for_every_network_before_it() -> None:
    net1_done = threading.Event()
    seen: list[bool] = []

    def attach(d: Delegate, lane: str) -> Result:
        if d.network == "vlan":
            seen.append(net1_done.is_set())
        result = Attach()(d, lane)
        if d.network == "net1":
            net1_done.set()
        return result

    nets = [delegate("eth0"), delegate("net1"), delegate("vlan", linkInContainer=True)]
    outcome = lanes.attach_in_lanes(nets, attach, beside_if("net1"))

    assert outcome.error is None
    assert seen == [True]


def test_a_failure_in_order_starts_nothing_after_it_and_rolls_back_what_ran() -> None:
    attach = Attach(fail=("net1",))
    nets = [delegate("eth0"), delegate("net1"), delegate("net2"), delegate("net3")]

    outcome = lanes.attach_in_lanes(nets, attach, beside_if("eth0", "net3"))

    assert outcome.error is not None and outcome.error.msg == "net1 failed"
    assert "net2" not in attach.started
    # What ran, the failed net1 included (its DEL cleans up), is what is rolled back;
    # net3, on the side lane from the start, may have run or been cancelled.
    assert [d.network for d in outcome.started] == [
        d.network for d in nets if d.network in attach.started
    ]
    assert "net1" in attach.started


def test_a_side_failure_stops_the_networks_after_it() -> None:
    eth0_started = threading.Event()
    attach = Attach(fail=("net1",), gates={"net1": eth0_started})

    def signal_eth0(d: Delegate, lane: str) -> Result:
        if d.network == "eth0":
            eth0_started.set()
        return attach(d, lane)

    nets = [delegate("net1"), delegate("eth0"), delegate("net2", linkInContainer=True)]
    outcome = lanes.attach_in_lanes(nets, signal_eth0, beside_if("net1"))

    assert outcome.error is not None and outcome.error.msg == "net1 failed"
    assert "net2" not in attach.started  # it waits for net1, which failed
    assert [d.network for d in outcome.started] == ["net1", "eth0"]


def test_the_first_failure_by_order_is_the_one_reported() -> None:
    net1_started, net2_failed = threading.Event(), threading.Event()
    attach = Attach(fail=("net1", "net2"), gates={"net1": net2_failed})

    def ordered(d: Delegate, lane: str) -> Result:
        if d.network == "net1":
            net1_started.set()
        if d.network == "net2":
            assert net1_started.wait(WAIT)
        try:
            return attach(d, lane)
        finally:
            if d.network == "net2":
                net2_failed.set()

    nets = [delegate("net1"), delegate("net2")]
    outcome = lanes.attach_in_lanes(nets, ordered, beside_if("net1"))

    assert outcome.error is not None and outcome.error.msg == "net1 failed"
    assert [d.network for d in outcome.started] == ["net1", "net2"]


SCOPE: contextvars.ContextVar[str] = contextvars.ContextVar("scope", default="none")


def test_side_networks_see_the_calls_context() -> None:
    """cni.callscope (exec timeouts, cancellation) lives in a ContextVar."""
    token = SCOPE.set("this call")
    seen: list[str] = []

    def attach(d: Delegate, lane: str) -> Result:
        seen.append(SCOPE.get())
        return Attach()(d, lane)

    try:
        outcome = lanes.attach_in_lanes([delegate("net1")], attach, beside_if("net1"))
    finally:
        SCOPE.reset(token)

    assert outcome.error is None
    assert seen == ["this call"]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"name": "n", "type": "macvlan"}, False),
        ({"name": "n", "type": "macvlan", "linkInContainer": True}, True),
        (
            {"name": "n", "plugins": [{"type": "macvlan"}, {"type": "vlan", "linkInContainer": 1}]},
            True,
        ),
        ({"name": "n", "plugins": [{"type": "macvlan", "linkInContainer": False}]}, False),
    ],
)
def test_links_in_pod(config: dict[str, object], expected: bool) -> None:
    assert Delegate(network="n", ifname="net1", config=config).links_in_pod is expected


def test_hung_side_networks_of_other_pods_do_not_hold_up_this_one() -> None:
    """Each call has its own side lane: no shared pool a few stuck delegates could fill."""
    gate = threading.Event()

    def stuck(d: Delegate, lane: str) -> Result:
        gate.wait(WAIT * 3)  # longer than this test waits for its own call
        return Attach()(d, lane)

    calls = [
        threading.Thread(
            target=lanes.attach_in_lanes, args=([delegate("net1")], stuck, beside_if("net1"))
        )
        for _ in range(16)
    ]
    for call in calls:
        call.start()
    outcomes: list[lanes.Outcome] = []
    this = threading.Thread(
        target=lambda: outcomes.append(
            lanes.attach_in_lanes([delegate("net2")], Attach(), beside_if("net2"))
        )
    )
    try:
        this.start()
        this.join(WAIT)
        assert outcomes and outcomes[0].error is None, "held up by other pods' delegates"
        assert names(outcomes[0].results) == ["net2"]
    finally:
        gate.set()
        for call in [*calls, this]:
            call.join(WAIT)
