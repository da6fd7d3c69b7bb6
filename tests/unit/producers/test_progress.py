"""A replay that falls behind its requested speed says so once, on a line of its own: by how
much and what its time goes to (it was silent: ``--transport http`` ran at 1.1 epochs/s where
the banner's 120x needs 4). After its first epochs the progress line says when the replay
expects to be done. Pure: the test gives the clock."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from producers.progress import BEHIND_AFTER_S, ETA_AFTER_EPOCHS, Progress, what_limits
from producers.settings import ReplaySettings


def _run(capsys: pytest.CaptureFixture[str], speed: float, epochs_per_s: float, seconds: int = 30) -> list[str]:
    now = [1000.0]
    bar = Progress(1000, True, speed=speed, limit="the uploads", clock=lambda: now[0])
    for t in range(1, seconds + 1):
        now[0] = 1000.0 + t
        bar.update(int(epochs_per_s * t), 100 * t, 0, force=True)
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("replay: behind")]


def test_behind_is_said_once_with_how_much_and_what_limits_it(capsys: pytest.CaptureFixture[str]) -> None:
    (line,) = _run(capsys, speed=120.0, epochs_per_s=1.1)
    assert line.startswith("replay: behind the requested 120x real time: 1.1 epochs/s of 4.0 (2"), line
    assert "epochs behind); its time goes to the uploads" in line


def test_keeping_up_or_unpaced_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, speed=120.0, epochs_per_s=4.0) == []
    assert _run(capsys, speed=0.0, epochs_per_s=0.1) == []  # as fast as possible: nothing to fall behind
    assert _run(capsys, speed=120.0, epochs_per_s=0.1, seconds=int(BEHIND_AFTER_S) - 1) == []  # its start


def test_what_limits_names_the_path() -> None:
    assert "HTTP request per device" in what_limits(ReplaySettings(via_shuffler=True, transport="http"))
    assert "one record per device report" in what_limits(ReplaySettings(via_shuffler=True))
    assert "1 producer process (" in what_limits(ReplaySettings())
    assert "4 producer processes" in what_limits(ReplaySettings(producers=4))


def test_the_line_says_when_the_replay_expects_to_be_done_after_its_first_epochs(
        capsys: pytest.CaptureFixture[str]) -> None:
    """1 epoch a second of 100: nothing said before ETA_AFTER_EPOCHS epochs; at 10 done, 90 s
    left ("~2 min") and the wall-clock time 90 s on (local time, to the minute)."""
    t0 = 1_790_000_000.0
    now = [t0]
    bar = Progress(100, True, clock=lambda: now[0])
    for t in range(1, 11):
        now[0] = t0 + t
        bar.update(t, 100 * t, 0, force=True)
    lines = capsys.readouterr().err.splitlines()
    assert all("done in" not in line for line in lines[:ETA_AFTER_EPOCHS - 1]), lines
    at = datetime.fromtimestamp(t0 + 10 + 90 + 30, UTC).astimezone()
    assert lines[-1].endswith(f"delivery failures 0  done in ~2 min, at {at:%H:%M}"), lines[-1]
    assert re.match(r"epoch 10/100 \(10%\)  1\.0 epochs/s  100 reports/s", lines[-1]), lines[-1]
    now[0] = t0 + 100
    bar.update(100, 10_000, 0, force=True)
    assert "done in" not in capsys.readouterr().err  # done: nothing left to expect


def test_a_terminal_line_rewritten_shorter_leaves_nothing_of_the_longer(capsys: pytest.CaptureFixture[str]) -> None:
    now = [0.0]
    bar = Progress(1000, True, clock=lambda: now[0])
    bar.tty = True
    now[0] = 10.0
    bar.update(500, 10**7, 0, force=True)  # "... done in ~10 s ..."
    now[0] = 11.0
    bar.update(501, 10, 0, force=True)
    first, second = capsys.readouterr().err.split("\r")[1:]
    assert len(second) >= len(first), (first, second)
