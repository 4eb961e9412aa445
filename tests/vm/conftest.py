"""Host side of the VM tier: one boot per session runs every selected guest test.

Each guest test shows up here as `test_guest[<file>::<test>]`; the boot happens
lazily in the `guest_run` session fixture, so it costs nothing when none is selected.
"""

from __future__ import annotations

import os

import pytest

from tests.vm import vm

_GUEST_PREFIX = f"{vm.GUEST_DIR.relative_to(vm.REPO).as_posix()}/"
_RUN_KEY = pytest.StashKey[vm.GuestRun]()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "guest_test" in metafunc.fixturenames:
        ids = vm.collect_guest_tests()
        metafunc.parametrize("guest_test", ids, ids=[i.removeprefix(_GUEST_PREFIX) for i in ids])


def _selected(session: pytest.Session) -> list[str]:
    """The guest node ids to run; empty means the whole guest directory."""
    chosen: list[str] = []
    for item in session.items:
        if item.path != vm.REPO / "tests" / "vm" / "test_guest_suite.py":
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is None or "guest_test" not in callspec.params:
            return []  # a whole-suite test is selected
        chosen.append(callspec.params["guest_test"])
    return chosen


@pytest.fixture(scope="session")
def guest_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> vm.GuestRun:
    """Boot the VM once and run the selected guest tests in it."""
    missing = vm.missing_tooling()
    if missing:
        pytest.skip(f"VM tooling missing: {', '.join(missing)} (run make setup)")
    if os.geteuid() != 0:
        pytest.skip("the VM tier needs root (the guest runs as the host user)")
    run = vm.run_guest_suite(tmp_path_factory.mktemp("vm"), _selected(request.session))
    request.config.stash[_RUN_KEY] = run
    return run


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    run = terminalreporter.config.stash.get(_RUN_KEY, None)
    if run is not None:
        status = "killed on timeout" if run.returncode is None else f"exit {run.returncode}"
        boot = "?" if run.boot_seconds is None else f"{run.boot_seconds:.1f}"
        terminalreporter.write_line(
            f"VM tier: one boot ran {len(run.results)} guest tests in {run.seconds:.1f} s "
            f"(boot {boot} s, root over {vm.guest_rootfs()}, {status}); "
            f"console and junit in {run.results_dir}"
        )
