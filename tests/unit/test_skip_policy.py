"""tests/skip_policy.py on a tiny suite of its own, run by a pytest in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

GUEST_TEST = """
import pytest

pytestmark = pytest.mark.skip(reason="needs the VM kernel: runs via tests/vm/test_guest_suite.py")

def test_in_the_guest():
    pass
"""


def run_suite(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """pytest over `files` (path -> source) in `tmp_path`, with the skip policy loaded."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for name, source in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "pytest", "-p", "tests.skip_policy", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*argv, "-rfE", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_listed_skip_passes_and_is_listed_in_the_summary(tmp_path: Path) -> None:
    done = run_suite(
        tmp_path,
        {"tests/vm/guest/test_sriov.py": GUEST_TEST, "test_ok.py": "def test_ok():\n    pass\n"},
    )
    assert done.returncode == 0, done.stdout
    assert "1 passed, 1 skipped" in done.stdout
    assert "1 allowed skips (tests/skip_policy.py)" in done.stdout
    assert "tests/vm/guest/test_sriov.py::test_in_the_guest" in done.stdout


def test_an_unlisted_skip_fails_the_run_with_its_reason(tmp_path: Path) -> None:
    done = run_suite(
        tmp_path,
        {
            "test_plugins.py": """
                import pytest

                def test_bridge():
                    pytest.skip("reference plugin /usr/lib/cni/bridge is not installed")
            """
        },
    )
    assert done.returncode == 1, done.stdout
    assert "1 failed" in done.stdout
    assert "unexpected skip: reference plugin /usr/lib/cni/bridge is not installed" in done.stdout


def test_a_skip_in_a_fixture_or_by_a_marker_fails_too(tmp_path: Path) -> None:
    done = run_suite(
        tmp_path,
        {
            "test_setup.py": """
                import pytest

                @pytest.fixture
                def cluster():
                    pytest.skip("kube-apiserver not built (run make setup)")

                def test_cluster(cluster):
                    pass

                @pytest.mark.skipif(True, reason="musl-gcc missing")
                def test_musl():
                    pass
            """
        },
    )
    assert done.returncode == 1, done.stdout
    assert "2 errors" in done.stdout  # both at setup
    assert "unexpected skip: kube-apiserver not built" in done.stdout
    assert "unexpected skip: musl-gcc missing" in done.stdout


def test_a_module_skipped_whole_fails_the_run(tmp_path: Path) -> None:
    done = run_suite(
        tmp_path,
        {
            "test_netns.py": """
                import pytest

                pytest.skip("the netns tier needs root", allow_module_level=True)

                def test_never():
                    pass
            """,
            "test_ok.py": "def test_ok():\n    pass\n",
        },
    )
    assert done.returncode != 0, done.stdout
    assert "ERROR collecting test_netns.py" in done.stdout
    assert "unexpected skip: the netns tier needs root" in done.stdout
    assert "Interrupted: 1 error during collection" in done.stdout


def test_an_allowed_reason_elsewhere_or_another_reason_there_fails(tmp_path: Path) -> None:
    """Both the node id and the reason must match one entry."""
    done = run_suite(
        tmp_path,
        {
            "tests/vm/guest/test_sriov.py": GUEST_TEST,
            "test_other.py": """
                import pytest

                def test_other():
                    pytest.skip("needs the VM kernel: runs via tests/vm/test_guest_suite.py")
            """,
            "tests/vm/guest/test_kernel.py": """
                import pytest

                def test_kernel():
                    pytest.skip("the VM kernel has no igb module")
            """,
        },
    )
    assert done.returncode == 1, done.stdout
    assert "2 failed, 1 skipped" in done.stdout
    assert "test_other.py::test_other" in done.stdout
    assert "test_kernel.py::test_kernel" in done.stdout
