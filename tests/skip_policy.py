"""A skip fails the run unless ALLOWED lists it, so a partial setup cannot pass as green.

On a machine `make setup` prepared every real dependency is there, so a skip means a
missing one, or a test that no longer runs. Only skips whose dependency cannot exist
here are allowed; each is listed at the end of the run. tests/conftest.py loads this.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class AllowedSkip:
    """Skips whose node id and reason both match (regexes, searched) are allowed."""

    nodeid: str
    reason: str
    why: str


ALLOWED = (
    AllowedSkip(
        r"^tests/vm/guest/",
        r"needs the VM kernel: runs via tests/vm/test_guest_suite\.py",
        "guest tests collected on the host: they run in the VM and are reported there "
        "as tests/vm/test_guest_suite.py::test_guest[...]",
    ),
)

_ALLOWED_KEY = pytest.StashKey[list[tuple[str, AllowedSkip]]]()


def allowed(nodeid: str, reason: str) -> AllowedSkip | None:
    """The entry of ALLOWED this skip matches, None if it is unexpected."""
    for entry in ALLOWED:
        if re.search(entry.nodeid, nodeid) and re.search(entry.reason, reason):
            return entry
    return None


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def _judge(config: pytest.Config, report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turn an unexpected skip into a failure; note an allowed one for the summary."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _reason(report)
    entry = allowed(report.nodeid, reason)
    if entry is not None:
        config.stash.setdefault(_ALLOWED_KEY, []).append((report.nodeid, entry))
        return
    report.outcome = "failed"
    report.longrepr = (
        f"unexpected skip: {reason}\n"
        "(a skip fails the run unless tests/skip_policy.py's ALLOWED lists it: "
        "install what is missing with `make setup`)"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _judge(item.config, report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A module or directory skipped whole (`allow_module_level`, a conftest) becomes a
    collection error: pytest then stops after collecting, naming every one."""
    report = yield
    _judge(collector.config, report)
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skips = terminalreporter.config.stash.get(_ALLOWED_KEY, [])
    if not skips:
        return
    terminalreporter.write_sep("-", f"{len(skips)} allowed skips (tests/skip_policy.py)")
    for entry in ALLOWED:
        ids = [nodeid for nodeid, e in skips if e is entry]
        if not ids:
            continue
        terminalreporter.write_line(f"{len(ids)} x {entry.why}")
        for nodeid in ids if len(ids) <= 3 else [ids[0], f"... and {len(ids) - 1} more"]:
            terminalreporter.write_line(f"    {nodeid}")
