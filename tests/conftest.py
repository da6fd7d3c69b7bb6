"""Fixtures shared by every tier: the system tools some tests need (see tests/system_tools.py:
skipped locally when missing, a failure under CI)."""

from __future__ import annotations

import pytest

from .system_tools import require_tool


@pytest.fixture
def promtool() -> str:
    """The path of ``promtool``."""
    return require_tool("promtool")


@pytest.fixture
def prometheus_bin() -> str:
    """The path of the ``prometheus`` server."""
    return require_tool("prometheus")
