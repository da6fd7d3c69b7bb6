"""Processes a test or a benchmark inspects: by pid (Linux ``/proc``), or a front door by its port."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["children", "cpu_s", "door_healthy", "door_pid", "frozen", "sigint_default", "stopped", "unread_at"]


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (started from any of its threads)."""
    kids: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return kids
    for task in tasks:
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return kids


def cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far; NaN for none or one gone."""
    if pid is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def door_pid(shuffler_pid: int) -> int:
    """The pid of a ``ptt shuffler --http-port``'s front door: its child process running the
    door (stream_app/shuffler/door_process.py), not multiprocessing's resource tracker."""
    doors = []
    for k in children(shuffler_pid):
        try:
            if b"resource_tracker" not in Path(f"/proc/{k}/cmdline").read_bytes():
                doors.append(k)
        except OSError:
            continue
    if len(doors) != 1:
        raise LookupError(f"process {shuffler_pid} has {len(doors)} front door processes, not one")
    return doors[0]


def door_healthy(port: int) -> bool:
    """The front door (or nginx in front of it) on loopback ``port`` answers ``GET /v1/health``
    with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=2) as r:  # noqa: S310 - loopback
            return bool(r.status == 200)
    except OSError:
        return False


def sigint_default() -> None:
    """The ``preexec_fn`` of every child a test sends SIGINT (Ctrl-C): SIGINT back to its default
    action before the exec, whatever the test process inherited.

    A background job of a non-interactive shell (``bash -c 'pytest ... & wait'``, as some CI
    runners start jobs) starts with SIGINT ignored; Python keeps an ignored SIGINT ignored (it
    puts its KeyboardInterrupt handler only over the default), and an ignored signal stays
    ignored across fork and exec. The child would then never see the test's Ctrl-C, and a
    make or shell under it could not even trap it. A handler, unlike ``SIG_IGN``, is reset by
    the exec: the child starts as if from a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stopped(pid: int) -> bool:
    """Every thread of process ``pid`` is stopped (state ``T``): a SIGSTOP has taken effect.

    kill(2) returns once the signal is pending; the kernel wakes one thread to take it, and that
    thread stops the others. On a busy machine that takes a while, and meanwhile the process's
    other threads go on working."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks]
    except OSError:
        return False
    return bool(states) and all(state in "Tt" for state in states)


@contextmanager
def frozen(pid: int, timeout_s: float = 30.0) -> Iterator[None]:
    """Process ``pid`` stopped (SIGSTOP) for the body, every one of its threads: entered only
    once /proc shows them all stopped; continued (SIGCONT) however the body ends."""
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + timeout_s
        while not stopped(pid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"process {pid} did not stop within {timeout_s:g}s of SIGSTOP")
            time.sleep(0.005)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def unread_at(port: int) -> int:
    """What a TCP listener on loopback ``port`` (IPv4) has not taken in yet: the connections in its
    accept queue and the bytes waiting on the connections it accepted (``/proc/net/tcp``'s
    rx_queue of each socket on that port). Above 0 at a frozen server: a client waits on it."""
    waiting = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port:
            waiting += int(fields[4].split(":")[1], 16)
    return waiting
