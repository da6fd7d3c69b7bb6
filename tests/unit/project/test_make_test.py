"""``make test`` as a person sees it: one line per finished test (pytest-xdist's verbose mode
wrote each test's name again as a line of its own: two lines per test), then the 25 slowest
tests (where the gate's time goes), and Ctrl-C ends it
with a line saying so, not make's ``*** [Makefile:..: test] Error 2``. The lint step is taken
as done (``-o lint``) and PYTEST_ARGS picks the tests."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.paths import ROOT
from tests.processes import sigint_default

HOUSE = str(ROOT / "tests" / "unit" / "project" / "test_house.py")


def _make_test(pytest_args: str) -> list[str]:
    if shutil.which("make") is None or not (ROOT / ".venv" / "bin" / "pytest").exists():
        pytest.skip("`make test` needs make and the project's .venv (make setup)")
    return ["make", "-s", "-C", str(ROOT), "-o", "lint", "test", "TEST_WORKERS=2",
            f"PYTEST_ARGS=-p no:cacheprovider {pytest_args}"]


def test_one_line_per_finished_test() -> None:
    done = subprocess.run(_make_test(HOUSE), capture_output=True, text=True, timeout=300, check=False)  # noqa: S603
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    slowest = next(i for i, line in enumerate(lines) if "slowest 25 durations" in line)  # where the time went
    named = [line for line in lines[:slowest] if "test_house.py::" in line]
    tests = Path(HOUSE).read_text().count("\ndef test_")
    assert tests >= 3 and len(named) == tests, "\n".join(lines)  # each of the file's tests, once
    assert all(line.startswith("[gw") and " PASSED " in line for line in named), "\n".join(named)


def test_ctrl_c_says_it_stopped_without_makes_error(tmp_path: Path) -> None:
    started = tmp_path / "started"
    blocking = tmp_path / "test_blocks.py"
    blocking.write_text("import threading\nfrom pathlib import Path\n\n\n"
                        "def test_waits_for_ctrl_c() -> None:\n"
                        f"    Path({str(started)!r}).write_text('running')\n"
                        "    threading.Event().wait()\n")
    # SIGINT as a terminal leaves it, even under a test process that inherited it ignored
    proc = subprocess.Popen(_make_test(f"{blocking} {HOUSE}"), stdout=subprocess.PIPE,  # noqa: S603
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=sigint_default)
    try:
        deadline = time.monotonic() + 240
        while not started.exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.poll()
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: make, its shell, pytest and its workers
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
    assert "make test: stopped by Ctrl-C" in err, out + err
    assert "***" not in err and "Error 2" not in err, err
