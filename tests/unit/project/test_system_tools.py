"""A CI run cannot pass by skipping: a test needing a missing system tool (prometheus, promtool)
skips locally with the reason and fails under CI (tests/system_tools.py); `make setup` under CI
refuses to go on without both tools; `.ci/run` sets CI itself."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.paths import ROOT
from tests.system_tools import require_tool


def _fake_tools(folder: Path, *names: str, script: str = "exit 0") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        tool = folder / name
        tool.write_text(f"#!/bin/sh\n{script}\n")
        tool.chmod(0o755)
    return folder


@pytest.mark.parametrize("tool", ["prometheus", "promtool"])
def test_a_missing_tool_skips_locally_and_fails_under_ci(tool: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def outcome() -> object:  # a skip or a failure, caught either way (neither may end this test)
        try:
            return require_tool(tool)
        except (pytest.skip.Exception, pytest.fail.Exception) as exc:
            return exc

    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    monkeypatch.delenv("CI", raising=False)
    local = outcome()
    assert isinstance(local, pytest.skip.Exception) and f"{tool} is not installed" in str(local), local
    monkeypatch.setenv("CI", "true")
    ci = outcome()
    assert isinstance(ci, pytest.fail.Exception), ci
    assert f"CI: {tool} is not installed" in str(ci) and "must not skip" in str(ci)
    _fake_tools(tmp_path, tool)
    assert outcome() == str(tmp_path / tool)  # present: neither skip nor failure


def _sysdeps(path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    """``make sysdeps`` with only ``path`` on PATH (and ``id``; no apt-get: nothing is installed)."""
    _fake_tools(path)
    (path / "id").unlink(missing_ok=True)
    (path / "id").symlink_to(str(shutil.which("id")))
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PATH": str(path)}
    if ci is not None:
        env["CI"] = ci
    make = shutil.which("make")
    assert make is not None
    return subprocess.run([make, "--no-print-directory", "-C", str(ROOT), "sysdeps"], env=env,  # noqa: S603
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("present", [(), ("promtool",), ("prometheus",)])
def test_make_sysdeps_under_ci_needs_both_tools(present: tuple[str, ...], tmp_path: Path) -> None:
    done = _sysdeps(_fake_tools(tmp_path / "bin", *present), ci="1")
    assert done.returncode != 0, done.stdout + done.stderr
    missing = next(t for t in ("prometheus", "promtool") if t not in present)
    assert f"CI: {missing} could not be installed" in done.stdout
    local = _sysdeps(tmp_path / "bin", ci=None)  # locally: a warning, and the tests skip
    assert local.returncode == 0 and "tests needing them skip" in local.stdout, local.stdout + local.stderr


def test_make_sysdeps_under_ci_with_both_tools(tmp_path: Path) -> None:
    done = _sysdeps(_fake_tools(tmp_path / "bin", "prometheus", "promtool"), ci="1")
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_ci_run_sets_ci(tmp_path: Path) -> None:
    """``.ci/run`` exports CI=1 itself and runs ``make test`` (a stand-in ``make`` reports both)."""
    fake = _fake_tools(tmp_path, "make", script='echo "CI=$CI make $*"')
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = f"{fake}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run([str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True,  # noqa: S603
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "CI=1 make test"
