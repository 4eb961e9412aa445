"""Host view of the guest suite: one test per guest test, plus the suite's exit status."""

from __future__ import annotations

import textwrap

import pytest

from tests.vm import vm

# The first test pays for the boot (the session fixture); vm.py kills the VM itself
# at vm.TIMEOUT, this is only the outer guard.
pytestmark = pytest.mark.timeout((vm.STALL_RETRIES + 1) * vm.TIMEOUT + 120)


def _no_result(run: vm.GuestRun, lines: int = 60) -> str:
    status = "killed on timeout" if run.returncode is None else f"exit {run.returncode}"
    tail = run.log_tail(lines)
    return f"guest pytest {status} after {run.seconds:.0f} s; console tail:\n{tail}"


def test_guest(guest_test: str, guest_run: vm.GuestRun) -> None:
    """The guest test `guest_test` passed in the VM."""
    result = guest_run.results.get(vm.junit_key(guest_test))
    if result is None:
        pytest.fail(
            f"{guest_test}: no result from the VM; {_no_result(guest_run, 15)}", pytrace=False
        )
    if result.outcome == "skipped":
        pytest.skip(f"in the VM: {result.message}")
    if result.outcome != "passed":
        pytest.fail(
            f"{guest_test} {result.outcome} in the VM: {result.message}\n{result.details}",
            pytrace=False,
        )


def test_guest_suite_passed(guest_run: vm.GuestRun) -> None:
    """The guest pytest exited 0: catches collection errors and crashes too."""
    if guest_run.returncode == 0:
        return
    failures = guest_run.failures()
    lines = [f"guest suite failed (results in {guest_run.results_dir}):"]
    for key, r in failures.items():
        lines += [f"{key} {r.outcome}: {r.message}", textwrap.indent(r.details, "    ")]
    if not failures:
        lines.append(_no_result(guest_run))
    pytest.fail("\n".join(lines), pytrace=False)
