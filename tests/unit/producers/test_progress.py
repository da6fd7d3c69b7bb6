"""A replay that falls behind its requested speed says so once, on a line of its own: by how
much and what its time goes to (it was silent: ``--transport http`` ran at 1.1 epochs/s where
the banner's 120x needs 4). Pure: the test gives the clock."""

from __future__ import annotations

import pytest

from producers.progress import BEHIND_AFTER_S, Progress, what_limits
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
