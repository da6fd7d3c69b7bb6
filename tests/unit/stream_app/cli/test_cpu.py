"""The demo's CPU line (``stream_app.cli.cpu``): a process's CPU seconds from /proc, a busy child's
counted while it runs, a gone one none."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from stream_app.cli.cpu import own_cpu_s, process_cpu_s

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def test_a_busy_childs_cpu_is_read_while_it_runs_and_a_gone_one_has_none() -> None:
    with subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                           "while time.process_time() - t < 1.0: pass\nprint(flush=True)\ninput()"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None and child.stdout.readline() == "\n"  # it has burnt 1 CPU-s
            used = process_cpu_s(child.pid)
            assert used is not None and 1.0 <= used < 5.0
        finally:
            child.kill()
    assert process_cpu_s(child.pid) is None


def test_own_cpu_counts_this_process() -> None:
    before, t = own_cpu_s(), time.process_time()
    while time.process_time() - t < 0.2:
        pass
    assert own_cpu_s() - before >= 0.19
