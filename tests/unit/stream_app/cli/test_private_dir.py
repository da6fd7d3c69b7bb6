"""A run's secret directory (stream_app/cli/private_dir.py) is gone however the run ends: it
returns or raises, SIGINT, SIGTERM, SIGHUP, a second Ctrl-C's forced quit (``os._exit``) --
and after SIGKILL, at the next run. Before: ``ptt demo --via-shuffler``'s ``ptt-demo-*``
directory with its ``enrollment-secret`` outlived an interrupted test run in the system's
temporary directory (a SIGKILL, or SIGTERM before the replay's handler was installed)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from producers.stopping import forced_quit
from stream_app.cli.private_dir import private_dir, runtime_base, sweep
from tests.paths import ROOT
from tests.processes import sigint_default

CHILD = """
import sys
from stream_app.cli.private_dir import private_dir
try:
    with private_dir("ptt-test-") as d:
        (d / "enrollment-secret").write_text("s" * 64)
        print(d, flush=True)
        sys.stdin.read()  # until the test signals it (or is gone: its end of the pipe closes)
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path


def _child(runtime: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)}, preexec_fn=sigint_default)
    assert proc.stdout is not None
    with proc.stdout:
        path = Path(proc.stdout.readline().strip())
    assert (path / "enrollment-secret").is_file() and path.parent == runtime, path
    return proc, path


def _close(proc: subprocess.Popen[str]) -> None:
    """The child's stdin, which held it (it is gone now)."""
    assert proc.stdin is not None
    proc.stdin.close()


def test_owner_only_under_the_runtime_dir_and_removed_when_the_block_ends_or_raises(runtime: Path) -> None:
    assert runtime_base() == runtime
    with private_dir("ptt-test-") as d:
        assert d.parent == runtime and d.name.startswith(f"ptt-test-{os.getpid()}-")
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        (d / "secret").write_text("x")
    assert not d.exists()
    with pytest.raises(RuntimeError), private_dir("ptt-test-") as d:
        (d / "secret").write_text("x")
        raise RuntimeError("boom")
    assert not d.exists()
    assert list(runtime.iterdir()) == []


def test_a_forced_quit_removes_it_before_the_process_ends(runtime: Path,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    """``os._exit`` runs no ``finally``: the forced quit removes it first (here ``end`` is not
    the process's real end)."""
    ended: list[int] = []
    with private_dir("ptt-test-") as d:
        (d / "secret").write_text("x")
        forced_quit(end=ended.append)
        assert ended == [130] and not d.exists()
    assert "forced quit" in capfd.readouterr().err
    forced_quit(end=ended.append)  # outside the block: nothing of it is left to run
    assert ended == [130, 130]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_the_run_as_ctrl_c_does_and_removes_it(runtime: Path, sig: signal.Signals) -> None:
    proc, path = _child(runtime)
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 130
    _close(proc)
    assert not path.exists()


def test_a_killed_runs_directory_is_removed_by_the_next_run_and_nothing_else(runtime: Path) -> None:
    proc, path = _child(runtime)
    proc.kill()
    proc.wait(timeout=30)
    _close(proc)
    assert path.exists()  # SIGKILL: nothing runs
    others = [runtime / "ptt-test-915wr4uc", runtime / f"ptt-test-{os.getpid()}-alive", runtime / "other"]
    for other in others:
        other.mkdir()
    (runtime / "ptt-test-1-file").write_text("not a directory")
    with private_dir("ptt-test-") as d:
        assert not path.exists()
        assert sorted(p.name for p in runtime.iterdir()) == sorted(
            [d.name, "ptt-test-1-file", *(o.name for o in others)])
    assert sweep(runtime, "ptt-test-") == []  # a running process's, other names, not directories: kept
