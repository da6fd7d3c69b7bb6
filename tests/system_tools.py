"""The one rule for tests that need a system tool (the Debian packages ``prometheus``: the
``prometheus`` server and ``promtool``; ``nginx``: the front door's proxy, deploy/nginx/):
locally a missing tool skips the test with the reason; under CI (the environment variable
``CI`` set and non-empty, as ``.ci/run`` and most CI services set it) it fails the test, so a
CI run can never pass by skipping what it must prove. ``make setup`` installs the packages,
and under CI refuses to go on without every tool."""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = ["in_ci", "require_tool"]

PACKAGE = {"prometheus": "prometheus", "promtool": "prometheus", "nginx": "nginx"}


def in_ci() -> bool:
    """True in a CI run: ``CI`` is set and non-empty (the Makefile's guard reads it the same way)."""
    return bool(os.environ.get("CI"))


def require_tool(name: str) -> str:
    """The path of the system tool ``name``; when it is missing, skip the calling test (locally)
    or fail it (under CI)."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")  # nginx: /usr/sbin, off a user's PATH
    if path is not None:
        return path
    why = f"{name} is not installed (apt-get install {PACKAGE.get(name, name)}, or `make setup` as root)"
    if in_ci():
        pytest.fail(f"CI: {why}; a CI run must not skip the tests that need it", pytrace=False)
    pytest.skip(why)
