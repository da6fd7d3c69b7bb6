"""``ptt demo`` that ends with epochs it replayed but the worker never published (a stalled
shuffler or worker: "the worker closed no further epoch for 60 s") exits ``EXIT_UNPUBLISHED``
with one line saying how many windows and rollups are missing -- not 0, as when it saved 860 of
~40,680 estimates of a day stalled in the shuffler. No broker: the decision
(:func:`stream_app.cli.demo.unpublished`) and the wait (its counts at the stall, the worker's
metrics and the clock stand-ins)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stream_app.cli import demo
from stream_app.cli.demo import Closing, unpublished
from stream_app.cli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNPUBLISHED


def test_everything_published_exits_as_before() -> None:
    closing = Closing(windows=2_880, closed=2_880, rollups=100, decided=100)
    assert unpublished(closing, EXIT_OK, 40_680) == (EXIT_OK, None)


def test_missing_windows_exit_non_zero_with_one_line_saying_how_many() -> None:
    code, line = unpublished(Closing(windows=11_808, closed=33, rollups=3_360, decided=3_360), EXIT_OK, 860)
    assert code == EXIT_UNPUBLISHED and code not in (EXIT_OK, EXIT_FAILURE, EXIT_INTERRUPTED)
    assert line is not None and len(line.splitlines()) == 1 and line.startswith("ptt demo: error: ")
    assert "11,775 of the 11,808 windows" in line and "860 estimates saved" in line and "rollups" not in line


def test_missing_rollups_alone_count_too() -> None:
    code, line = unpublished(Closing(windows=10, closed=10, rollups=4, decided=1), EXIT_OK, 50)
    assert code == EXIT_UNPUBLISHED and line is not None and "3 of its 4 rollups" in line


@pytest.mark.parametrize("code", [EXIT_INTERRUPTED, EXIT_FAILURE])
def test_an_interrupted_or_failed_demo_keeps_its_code(code: int) -> None:
    assert unpublished(Closing(windows=10, closed=2), code, 5) == (code, None)


def test_the_wait_returns_the_counts_it_stalled_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows 33 of 100 closed, then nothing for the wait's timeout: the counts come back
    (incomplete); a worker that closes them all ends the wait complete."""
    now = [0.0]
    monkeypatch.setattr(demo, "time", SimpleNamespace(monotonic=lambda: now[0]))
    stop = SimpleNamespace(requested=False, wait=lambda s: now.__setitem__(0, now[0] + s))
    closed = {b"ptt_epochs_closed_total{": 33.0}

    def metrics(url: str, families: tuple[bytes, ...] = (b"ptt_epochs_closed_total{",)) -> float:
        return closed.get(families[0], 7.0)  # the rollups: all 7 decided

    monkeypatch.setattr(demo, "_closed_epochs", metrics)
    got = demo._wait_closed("http://x/metrics", 100, stop, timeout_s=60.0, rollups=7)  # type: ignore[arg-type]
    assert got == Closing(100, 33, 7, 7) and not got.complete and now[0] >= 60.0
    closed[b"ptt_epochs_closed_total{"] = 100.0
    assert demo._wait_closed("http://x/metrics", 100, stop, rollups=7).complete  # type: ignore[arg-type]


def test_a_shuffler_still_reading_is_no_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    """--via-shuffler: no window closes while the shuffler reads an hour's 10M device reports
    (minutes); its growing count of reports read defers the stall, which comes ``timeout_s``
    after its last growth (here at 150 s: the wait ends at 210 s, not at 60)."""
    now = [0.0]
    monkeypatch.setattr(demo, "time", SimpleNamespace(monotonic=lambda: now[0]))
    stop = SimpleNamespace(requested=False, wait=lambda s: now.__setitem__(0, now[0] + s))
    reads = "http://127.0.0.1:9/metrics"  # the worker closes nothing; the shuffler reads until 150 s
    monkeypatch.setattr(demo, "_closed_epochs", lambda url, families=(): min(now[0], 150) * 1e5 if url == reads else 0)
    got = demo._wait_closed("http://x/metrics", 1, stop, timeout_s=60.0,  # type: ignore[arg-type]
                            shuffler_port=9)
    assert not got.complete and 210.0 <= now[0] <= 211.0
