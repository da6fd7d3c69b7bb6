"""``ptt demo`` outlives a closed stdout or stderr (``make run | tee run.log``, then Ctrl-C,
which ends tee too): a write into the closed pipe points the descriptor at /dev/null instead of
raising BrokenPipeError, so the demo goes on saving its results (tests/integration/test_demo.py
runs the whole case)."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from stream_app.cli.demo_output import DropWhenClosed, output_may_close


def test_a_closed_pipe_is_dropped_not_raised() -> None:
    r, w = os.pipe()
    with os.fdopen(w, "w") as stream:
        safe = DropWhenClosed(stream)
        safe.write("seen\n")
        safe.flush()
        assert os.read(r, 100) == b"seen\n" and not safe.closed_pipe
        os.close(r)  # the reader is gone
        with pytest.raises(BrokenPipeError):  # what the demo met before
            print("lost", file=stream, flush=True)
        print("lost", file=safe, flush=True)
        assert safe.closed_pipe
        assert stat.S_ISCHR(os.fstat(stream.fileno()).st_mode)  # now /dev/null: the exit's flush cannot fail
        safe.write("dropped\n")
        safe.flush()
        assert safe.fileno() == stream.fileno()  # everything else is the stream's


def test_the_demo_wraps_stdout_and_stderr_while_it_runs() -> None:
    before = sys.stdout, sys.stderr
    with output_may_close():
        assert isinstance(sys.stdout, DropWhenClosed) and isinstance(sys.stderr, DropWhenClosed)
    assert (sys.stdout, sys.stderr) == before


def test_after_the_pipe_closed_the_lines_go_to_the_fallback() -> None:
    """``make run | tee run.log`` and Ctrl-C: the line that met the closed pipe and every later
    one ("saved ...", "report ...") reach the fallback (stderr: the terminal), not /dev/null."""
    r, w = os.pipe()
    fr, fw = os.pipe()
    with os.fdopen(w, "w") as stream, os.fdopen(fw, "w") as fallback:
        safe = DropWhenClosed(stream, fallback)
        print("seen", file=safe, flush=True)
        assert os.read(r, 100) == b"seen\n"
        os.close(r)  # tee is gone
        print("saved 12 estimates", file=safe, flush=True)
        print("report      summary.txt", file=safe, flush=True)
        assert safe.closed_pipe
        assert os.read(fr, 1000) == b"saved 12 estimates\nreport      summary.txt\n"
    os.close(fr)


def test_with_stdout_and_stderr_both_gone_the_lines_reach_the_terminal() -> None:
    """``make run 2>&1 | tee run.log`` and Ctrl-C: both streams meet the closed pipe, and the
    lines go to the controlling terminal (/dev/tty): here a pseudo-terminal made the child's."""
    import fcntl
    import pty
    import select
    import subprocess
    import termios
    import time

    script = """if True:
        import os
        from stream_app.cli.demo_output import DropWhenClosed, ToTerminal
        def closed():
            r, w = os.pipe()
            os.close(r)
            return os.fdopen(w, "w")
        err = DropWhenClosed(closed(), ToTerminal())
        out = DropWhenClosed(closed(), err)
        print("saved 12 estimates", file=out, flush=True)
        print("report      summary.txt", file=err, flush=True)
    """
    master, slave = pty.openpty()

    def controlling_terminal() -> None:  # after setsid (start_new_session): the pty becomes the session's
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([sys.executable, "-c", script], stdin=slave, stdout=subprocess.DEVNULL,  # noqa: S603
                            stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=controlling_terminal)
    os.close(slave)
    got = b""
    deadline = time.monotonic() + 60
    try:
        while b"summary.txt" not in got and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    got += os.read(master, 1000)
                except OSError:  # the child closed the terminal
                    break
    finally:
        assert proc.wait(timeout=60) == 0
        os.close(master)
    assert b"saved 12 estimates" in got and b"report      summary.txt" in got, got
