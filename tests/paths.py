"""Where the repository is, for tests that read its files (README, deploy/, the packages)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
