"""Fixtures for the device plugin tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.deviceplugin.fake_sysfs import FakeSysfs


@pytest.fixture
def fake_sysfs(tmp_path: Path) -> FakeSysfs:
    """An empty FAKE sysfs root (the host has no SR-IOV); tests add devices to it."""
    return FakeSysfs(tmp_path / "sys")
