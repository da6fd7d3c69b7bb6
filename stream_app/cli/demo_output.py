"""What ``ptt demo`` prints, and where it goes: a reader that goes away (``make run | tee
run.log`` and a Ctrl-C, which ends ``tee`` too) ends only the printing (:class:`DropWhenClosed`);
every line also goes to ``<out>/run.log`` (:class:`CopyTo`), so the closing lines a dead
``tee`` missed are kept."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO, cast

__all__ = ["CopyTo", "DropWhenClosed", "FileCopy", "ToTerminal", "output_may_close"]


class DropWhenClosed:
    """A text stream whose reader may go away: ``make run | tee run.log`` and Ctrl-C, which ends
    ``tee`` too. The first write that meets the closed pipe (EPIPE) points the descriptor at
    /dev/null, so the demo goes on stopping cleanly and saving its results instead of dying of
    BrokenPipeError (or of it again when Python flushes at exit); that write and every later
    one go to ``fallback`` (stdout's is stderr, stderr's the terminal, :class:`ToTerminal`), or
    are dropped without one: the lines that say what was saved still reach the person."""

    def __init__(self, stream: TextIO, fallback: TextIO | None = None) -> None:
        self._stream = stream
        self._fallback = fallback
        self._pending: list[str] = []  # written since the last flush that reached the reader
        self.closed_pipe = False

    def write(self, text: str) -> int:
        if self.closed_pipe:
            self._to_fallback(text)
            return len(text)
        try:
            self._stream.write(text)
            self._pending.append(text)
        except BrokenPipeError:
            self._to_devnull(text)
        return len(text)

    def flush(self) -> None:
        if self.closed_pipe:
            if self._fallback is not None:
                self._fallback.flush()
            return
        try:
            self._stream.flush()
            self._pending = []
        except BrokenPipeError:
            self._to_devnull("")

    def _to_fallback(self, text: str) -> None:
        if self._fallback is not None and text:
            with contextlib.suppress(OSError, ValueError):
                self._fallback.write(text)
                self._fallback.flush()

    def _to_devnull(self, text: str) -> None:
        self.closed_pipe = True
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._stream.fileno())
            finally:
                os.close(null)
        lost, self._pending = "".join(self._pending) + text, []
        self._to_fallback(lost)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class ToTerminal:
    """Writes to the controlling terminal (``/dev/tty``), opened at the first write; dropped
    when there is none (a service, a test): the last resort of :class:`DropWhenClosed`."""

    def __init__(self) -> None:
        self._tty: TextIO | None = None
        self._failed = False

    def write(self, text: str) -> int:
        if self._tty is None and not self._failed:
            try:
                self._tty = open("/dev/tty", "w")  # noqa: SIM115 - kept open until the process ends
            except OSError:
                self._failed = True
        if self._tty is not None:
            with contextlib.suppress(OSError):
                self._tty.write(text)
        return len(text)

    def flush(self) -> None:
        if self._tty is not None:
            with contextlib.suppress(OSError):
                self._tty.flush()


class CopyTo:
    """Writes to ``stream`` and appends the same lines to a file (opened, its directory made, at
    the first write): the demo's ``run.log``. A progress bar's redraws on a terminal (text that
    starts with a carriage return) stay off the file; a file that cannot be written is given up
    silently (the terminal still has every line)."""

    def __init__(self, stream: TextIO, file: FileCopy) -> None:
        self._stream = stream
        self._file = file

    def write(self, text: str) -> int:
        if not text.startswith("\r"):
            self._file.write(text)
        return self._stream.write(text)

    def flush(self) -> None:
        self._file.flush()
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class FileCopy:
    """The one file both of :class:`CopyTo`'s streams append to (line-buffered)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: TextIO | None = None
        self._failed = False

    def write(self, text: str) -> None:
        if self._fh is None and not self._failed:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = self.path.open("w", buffering=1)
            except OSError:
                self._failed = True
        if self._fh is not None:
            with contextlib.suppress(OSError, ValueError):
                self._fh.write(text)

    def flush(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError, ValueError):
                self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None


@contextlib.contextmanager
def output_may_close(copy: Path | None = None) -> Iterator[None]:
    """stdout and stderr as :class:`DropWhenClosed` while the demo runs: stdout falls back to
    stderr, stderr to the terminal. With ``copy``, every line printed also goes to that file
    (the demo's ``run.log``): a ``| tee`` that Ctrl-C ended does not get the closing lines."""
    saved = sys.stdout, sys.stderr
    err = cast(TextIO, DropWhenClosed(sys.stderr, cast(TextIO, ToTerminal())))
    out = cast(TextIO, DropWhenClosed(sys.stdout, err))
    file = FileCopy(copy) if copy is not None else None
    if file is not None:  # outermost: a line reaches the file once, wherever its stream then sends it
        out, err = cast(TextIO, CopyTo(out, file)), cast(TextIO, CopyTo(err, file))
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        if file is not None:
            file.close()
