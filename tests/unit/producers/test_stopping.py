"""producers/stopping.py: a second Ctrl-C that lands where the interpreter drops exceptions
still forces the quit, and the user sees no traceback. Deterministic: no false-failure rate."""

from __future__ import annotations

import gc
import sys
import time

import pytest

from producers import stopping
from producers.stopping import StopFlag


class _Finalized:
    def __del__(self) -> None:
        raise KeyboardInterrupt  # where a Ctrl-C can land: the interpreter prints and drops it here


def test_a_second_ctrl_c_inside_a_finalizer_still_quits_without_a_traceback(monkeypatch: pytest.MonkeyPatch,
                                                                           capfd: pytest.CaptureFixture[str]) -> None:
    quits: list[float] = []
    monkeypatch.setattr(stopping, "_quit_after", quits.append)  # not the process's real end in a test
    gc.collect()  # earlier tests' garbage: collected below, the re-sent signal could land in its finalizers
    with StopFlag(notice=False) as flag:
        flag.event.set()  # the first Ctrl-C came: the next one forces the quit
        with pytest.raises(KeyboardInterrupt):
            _Finalized()  # dropped at once: its KeyboardInterrupt cannot propagate from __del__
            gc.collect()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the re-raised signal's KeyboardInterrupt lands here
                time.sleep(0.001)
    err = capfd.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err, err
    # one forced quit per SIGINT that reached the handler: more than one when a re-sent signal
    # landed in another dropped place first (garbage of earlier tests, collected meanwhile)
    assert quits and set(quits) == {stopping.FORCE_QUIT_GRACE_S}, quits


def test_other_dropped_exceptions_go_to_the_hook_before(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[type[BaseException] | None] = []

    def hook(info: object) -> None:
        seen.append(getattr(info, "exc_type", None))

    monkeypatch.setattr(sys, "unraisablehook", hook)

    class Broken:
        def __del__(self) -> None:
            raise ValueError("a finalizer's own error")

    with StopFlag(notice=False):
        Broken()
        gc.collect()
    assert seen == [ValueError]
    assert sys.unraisablehook is hook  # restored on exit


def test_the_first_ctrl_c_line_starts_a_line_of_its_own_on_a_terminal() -> None:
    """On a terminal the progress bar's line ends in a carriage return (no newline), and the
    terminal echoes ``^C`` onto it: the notice must begin a new line (it ran on after ``^C``).
    A process with stderr on a pseudo-terminal draws a progress line, then gets SIGINT."""
    import os
    import pty
    import select
    import subprocess

    script = ("import os, signal, sys\n"
              "from producers.stopping import StopFlag\n"
              "with StopFlag() as stop:\n"
              "    sys.stderr.write('\\repoch 3/10 (30%)'); sys.stderr.flush()\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    assert stop.wait(10)\n")
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.DEVNULL,  # noqa: S603
                            stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    got = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if select.select([leader], [], [], 0.5)[0]:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the pty closed: the process ended
                break
            if not chunk:
                break
            got += chunk
        elif proc.poll() is not None:
            break
    os.close(leader)
    assert proc.wait(timeout=30) == 0, got
    text = got.decode().replace("\r\n", "\n")
    assert "epoch 3/10 (30%)\nptt: stopping cleanly; Ctrl-C again to quit at once\n" in text, repr(text)
