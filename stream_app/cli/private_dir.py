"""A directory for one run's secrets (``ptt demo --via-shuffler``'s enrollment secret): owner
only (0700), outside any output directory (which is for sharing) -- under ``$XDG_RUNTIME_DIR``
(memory, per user, emptied at logout) when set, else the system's temporary directory -- and
removed however the run ends:

- it returns, or raises (Ctrl-C's KeyboardInterrupt included): ``finally``;
- SIGTERM or SIGHUP, whose default ends the process at once with no ``finally`` run: where
  nothing else handles them, they raise KeyboardInterrupt inside the block (the command ends
  as by Ctrl-C, exit code 130, its own ``finally`` blocks run too);
- a second Ctrl-C's forced quit (``os._exit`` after a grace): :func:`producers.stopping.before_forced_quit`;
- SIGKILL (or a power cut) leaves it; its name carries the process id, and the next run
  removes this user's directories of processes that are gone (:func:`sweep`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from producers.stopping import before_forced_quit

__all__ = ["ENDING_SIGNALS", "private_dir", "runtime_base", "sweep"]

ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # by default they end the process with no cleanup


def runtime_base() -> Path:
    """``$XDG_RUNTIME_DIR`` when it is a writable directory, else the system's temporary directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    usable = runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK)
    return Path(runtime) if usable and runtime else Path(tempfile.gettempdir())


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that id
        return True
    return True


def sweep(base: Path, prefix: str) -> list[Path]:
    """Remove this user's directories ``<prefix><pid>-*`` under ``base`` whose process is gone
    (it was killed before it could remove them); returns them. Any other name, another
    user's directory and a running process's are left alone."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[a-z0-9_]+")
    removed = []
    for path in base.iterdir() if base.is_dir() else ():
        found = pattern.fullmatch(path.name)
        if found is None:
            continue
        with contextlib.suppress(OSError):
            st = path.lstat()
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not _running(int(found.group(1))):
                shutil.rmtree(path)
                removed.append(path)
    return removed


@contextlib.contextmanager
def _ending_signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt where their default (the end of the process,
    no ``finally``) is in force; a handler installed inside the block (the replay's StopFlag)
    takes them while it is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in ENDING_SIGNALS
                if signal.getsignal(sig) == signal.SIG_DFL}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def private_dir(prefix: str) -> Iterator[Path]:
    """A fresh owner-only directory ``<prefix><pid>-<random>`` under :func:`runtime_base`, removed
    with what it holds when the block ends, however (the module's docstring); killed runs' are
    swept first."""
    base = runtime_base()
    sweep(base, prefix)
    with _ending_signals_raise():
        path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base))

        def remove() -> None:
            shutil.rmtree(path, ignore_errors=True)

        try:
            with before_forced_quit(remove):
                yield path
        finally:
            remove()
