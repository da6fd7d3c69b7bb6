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
