"""The VM harness's handling of a wedged guest, with a FAKE VM: a shell command in place
of vng (a real wedge cannot be produced on demand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.vm import vm


@pytest.fixture
def fake_vm(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each boot runs the next shell script of the returned list, with a 1 s stall limit."""
    scripts: list[str] = []
    monkeypatch.setattr(vm, "STALL_SECONDS", 1.0)
    monkeypatch.setattr(vm, "guest_command", lambda results_dir, selected: str(results_dir))
    monkeypatch.setattr(vm, "vng_argv", lambda results_dir, command: ["sh", "-c", scripts.pop(0)])
    return scripts


def test_a_silent_guest_is_killed_and_booted_again_with_its_console_and_test_kept(
    fake_vm: list[str], tmp_path: Path
) -> None:
    wedge = "echo booted; echo tests/vm/guest/test_x.py::test_y > {}/progress.log; sleep 60"
    results = tmp_path / "vm0"
    fake_vm += [wedge.format(results), wedge.format(results), "echo ..; exit 0"]
    run = vm.run_guest_suite(results, timeout=30)

    assert run.returncode == 0 and fake_vm == []
    assert run.log == "..\n"
    for n in (1, 2):
        console = (tmp_path / f"vm0-stalled{n}" / "console.log").read_text()
        assert console.startswith("booted\n")
        assert console.endswith(
            "*** VM killed: no console output for 1 s; "
            "the guest was in tests/vm/guest/test_x.py::test_y ***\n"
        )


def test_a_guest_silent_through_every_retry_is_reported_killed(
    fake_vm: list[str], tmp_path: Path
) -> None:
    fake_vm += ["sleep 60"] * (vm.STALL_RETRIES + 1)
    run = vm.run_guest_suite(tmp_path / "vm0", timeout=30)

    assert run.returncode is None and run.results == {} and fake_vm == []
    assert run.log_tail(1) == "*** VM killed: no console output for 1 s ***"
