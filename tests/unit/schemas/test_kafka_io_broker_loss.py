"""Deciding that a broker is lost (pure), the worker's guard (no network), and what the
command line makes of a loss: exit code 7, the summary of what was acknowledged on stdout,
one line on stderr. The real broker dying is tests/integration/test_broker_loss.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from producers import replay as replay_mod
from producers.replay import ReplayLost, ReplaySummary
from producers.settings import ReplaySettings
from producers.sink import ReportSink
from schemas.kafka_io import BrokerHealth, BrokerLost, BrokerUnavailable, broker_lost, confirm_period_s
from stream_app.cli import main
from stream_app.cli.errors import EXIT_BROKER_LOST, EXIT_CODES
from stream_app.cli.replay import replay_summary_lines
from stream_app.guard import BrokerGuard
from stream_app.settings import WorkerSettings
from stream_app.worker import app as app_mod


def test_silence_counts_from_the_last_sign_of_life_or_the_start_of_a_wait() -> None:
    h = BrokerHealth(timeout_s=10.0, now=0.0)
    assert h.silent(9.0, "refused") is None
    h.alive(9.0)  # an acknowledgement
    assert h.silent(18.5, "refused") is None
    h.waiting(100.0)  # idle for long, then a new wait: not silent since 9 s
    assert h.silent(105.0, "refused") is None
    assert h.silent(110.5, "refused") == "no answer from the broker for 10.5s: refused"
    h.alive(111.0)  # the verdict sticks
    assert h.lost is not None and h.seen({"t": "x"}, 112.0) == h.lost


def test_topics_without_ids_are_not_judged_by_id() -> None:
    h = BrokerHealth(10.0, 0.0)
    assert h.seen({"t": ""}, 0.0) is None and h.seen({"t": "00000000-0000-0000-0000-000000000000"}, 1.0) is None
    assert h.seen({"t": "a"}, 2.0) is None and h.seen({"t": "a", "u": "b"}, 3.0) is None
    assert h.seen({"t": "a", "u": "c"}, 4.0) == "topic u was deleted and recreated: the broker restarted?"


# -- one metadata answer is not a verdict (an injected clock, a scripted sequence of answers) --------

def _answers(h: BrokerHealth, script: list[tuple[float, dict[str, str | None]]]) -> list[str | None]:
    """Feed ``(now, answer)`` pairs in order; every verdict returned along the way."""
    return [h.seen(answer, now) for now, answer in script]


def test_a_topic_the_broker_never_showed_is_not_gone() -> None:
    """A topic about to be created (the worker ensures its topics; a replay's truth topic) is
    absent from every answer for a minute: nothing is lost. Once shown, it is judged."""
    assert confirm_period_s(3.0) == 1.0
    h = BrokerHealth(timeout_s=3.0, now=0.0)
    verdicts = _answers(h, [(0.5 * i, {"t": None, "u": "id-u"}) for i in range(120)])
    assert verdicts == [None] * 120 and not h.pending
    assert h.seen({"t": "id-t", "u": "id-u"}, 60.0) is None  # created at last
    assert h.seen({"t": None, "u": "id-u"}, 60.5) is None and h.pending
    assert h.seen({"t": None, "u": "id-u"}, 61.5) is not None


def test_gone_takes_consecutive_absent_answers_over_the_confirmation_period() -> None:
    h = BrokerHealth(timeout_s=3.0, now=0.0)  # confirmed after 1 s
    assert h.seen({"t": "id-t"}, 0.0) is None
    assert _answers(h, [(1.0, {"t": None}), (1.5, {"t": None}), (1.99, {"t": None})]) == [None] * 3
    assert h.pending
    assert h.seen({"t": None}, 2.0) == ("topic t is gone (absent from 4 metadata answers over 1.0s): "
                                        "deleted, or the broker restarted")
    # two answers a confirmation period apart are enough; one answer never is, however late
    h = BrokerHealth(timeout_s=30.0, now=0.0)  # confirmed after 10 s
    assert h.seen({"t": "id-t"}, 0.0) is None
    assert h.seen({"t": None}, 500.0) is None
    assert h.seen({"t": None}, 509.0) is None
    assert h.seen({"t": None}, 510.0) is not None
    h = BrokerHealth(timeout_s=3.0, now=0.0, confirm_s=0.0)  # no period at all: still two answers
    assert h.seen({"t": "id-t"}, 0.0) is None and h.seen({"t": None}, 0.0) is None
    assert h.seen({"t": None}, 0.0) is not None


def test_an_answer_that_shows_the_topic_again_starts_the_confirmation_over() -> None:
    """Under load a broker may answer "unknown topic" once, then show it again: flapping for a
    minute is not a loss; absent for the whole period after the last showing is."""
    h = BrokerHealth(timeout_s=3.0, now=0.0)
    flapping = [(0.4 * i, {"t": None if i % 2 else "id-t"}) for i in range(150)]
    assert _answers(h, flapping) == [None] * 150
    assert h.seen({"t": "id-t"}, 60.0) is None and not h.pending
    assert _answers(h, [(60.4, {"t": None}), (60.8, {"t": None}), (61.2, {"t": "id-t"}),
                        (61.6, {"t": None}), (62.0, {"t": None}), (62.4, {"t": None})]) == [None] * 6
    assert h.seen({"t": None}, 62.6) is not None  # 1.0 s after 61.6


def test_silence_between_absent_answers_neither_confirms_nor_clears() -> None:
    h = BrokerHealth(timeout_s=3.0, now=0.0)
    assert h.seen({"t": "id-t"}, 0.0) is None and h.seen({"t": None}, 0.5) is None
    h.alive(0.5)
    assert h.silent(2.0, "timed out") is None  # a failed request: no answer about the topic
    assert h.pending
    assert h.seen({"t": None}, 2.5) is not None


def test_a_new_topic_id_is_a_verdict_at_once() -> None:
    """A topic id is assigned once, at creation: an answer naming another id is a new topic
    under the old name (not a lagging answer), so it is not confirmed -- also while an
    absence is being confirmed."""
    h = BrokerHealth(timeout_s=30.0, now=0.0)
    assert h.seen({"t": "id-1", "u": "id-2"}, 0.0) is None
    assert h.seen({"t": "id-9", "u": "id-2"}, 0.1) == "topic t was deleted and recreated: the broker restarted?"
    h = BrokerHealth(timeout_s=30.0, now=0.0)
    assert h.seen({"t": "id-1"}, 0.0) is None and h.seen({"t": None}, 5.0) is None
    assert h.seen({"t": "id-9"}, 5.5) == "topic t was deleted and recreated: the broker restarted?"


class _Script:
    """A broker's metadata answers in order, and a clock that each answer moves on by ``step``."""

    def __init__(self, answers: list[dict[str, str | None]], step: float) -> None:
        self.answers, self.step, self.now = list(answers), step, 1000.0

    def clock(self) -> float:
        return self.now

    def topic_ids(self) -> dict[str, str | None]:
        self.now += self.step
        return self.answers.pop(0)


def _scripted_guard(answers: list[dict[str, str | None]], step: float) -> tuple[BrokerGuard, _Script]:
    script = _Script(answers, step)
    guard = BrokerGuard(WorkerSettings(broker_loss_timeout_s=3.0), ["a", "b"])
    watch = guard._watch
    watch.clock = script.clock
    watch.health = BrokerHealth(3.0, script.clock())
    watch.topic_ids = script.topic_ids  # type: ignore[method-assign]
    return guard, script


def test_guard_baseline_is_what_the_broker_showed_once_the_topics_were_ensured() -> None:
    """The guard's checks as they run (check_interval_s(3) = 0.5 s apart): topics that did not
    exist yet at the first checks are not gone; after the baseline (know()), one "unknown"
    answer is not a loss, a confirmed absence is, and a new id is at once."""
    shown = {"a": "id-a", "b": "id-b"}
    guard, _ = _scripted_guard([{"a": None, "b": None}] * 40 + [shown], step=0.5)
    assert [guard._watch.check() for _ in range(41)] == [None] * 41  # 20 s before they appear

    guard, _ = _scripted_guard([{"a": None, "b": "id-b"}, shown, shown], step=0.5)
    guard.know(shown)
    assert [guard._watch.check() for _ in range(3)] == [None] * 3

    guard, _ = _scripted_guard([{"a": None, "b": "id-b"}] * 3, step=0.5)
    guard.know({**shown, "not-watched": "x"})
    verdicts = [guard._watch.check() for _ in range(3)]
    assert verdicts[:2] == [None, None] and verdicts[2] is not None and verdicts[2].startswith("topic a is gone")

    guard, _ = _scripted_guard([{"a": "id-a", "b": "id-new"}], step=0.5)
    guard.know(shown)
    assert guard._watch.check() == "topic b was deleted and recreated: the broker restarted?"


def test_broker_lost_is_a_broker_error_with_what_to_do() -> None:
    exc = broker_lost(ReplaySettings(bootstrap_servers="10.0.0.1:9092"), "topic x is gone")
    assert isinstance(exc, BrokerUnavailable)  # callers catching the broker's errors still do
    text = str(exc)
    assert text.startswith("lost the Kafka broker at 10.0.0.1:9092 mid-run (topic x is gone); ")
    assert "start the broker again" in text and "--broker-loss-timeout-s" in text and "\n" not in text


def test_guard_declares_once_and_one_reporter_settles() -> None:
    guard = BrokerGuard(WorkerSettings(broker_loss_timeout_s=5.0), ["t"])
    calls: list[str] = []
    guard._on_lost = calls.append  # as start() would, without the checking thread
    assert guard.failing("publishing estimates", since=float("inf"), why="KafkaTimeoutError") is None
    threads = [threading.Thread(target=guard.declare, args=(f"reason {i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and guard.lost == calls[0]
    assert guard.failing("publishing estimates", since=0.0, why="x") == calls[0]  # the first verdict sticks
    assert [guard.settle() for _ in range(3)] == [True, False, False]


def test_guard_failing_past_the_timeout_is_a_loss() -> None:
    guard = BrokerGuard(WorkerSettings(broker_loss_timeout_s=1.0), ["t"])
    verdict = guard.failing("publishing estimates", since=0.0, why="KafkaTimeoutError: expired")
    assert verdict is not None and verdict.startswith("publishing estimates failed for ")
    assert verdict.endswith(": KafkaTimeoutError: expired")


def test_exit_code_7_is_documented() -> None:
    assert EXIT_BROKER_LOST == 7 and "lost mid-run" in EXIT_CODES[7]


def _summary(epochs: int, reports: int, records: int, reports_sent: int, records_sent: int) -> ReplaySummary:
    return ReplaySummary(epochs=epochs, reports=reports, records=records, reports_sent=reports_sent,
                         records_sent=records_sent, fleet_size=247, data_quality="ok", elapsed_s=9.5)


def test_summary_lines_say_what_was_acknowledged() -> None:
    same = replay_summary_lines(_summary(epochs=5, reports=10, records=2, reports_sent=10, records_sent=2))
    assert same[1] == "fleet: 247 vehicles; replayed 5 epochs, 10 reports in 2 records in 9.5s"
    less = replay_summary_lines(_summary(epochs=5, reports=3208, records=20, reports_sent=3846, records_sent=24))
    assert less[1] == ("fleet: 247 vehicles; replayed 5 epochs, the broker acknowledged 3,208 of 3,846 reports sent "
                       "(20 of 24 records) in 9.5s")


def test_replay_that_lost_the_broker_prints_its_summary_then_one_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def lost(settings: ReplaySettings, progress: bool = True) -> ReplaySummary:
        summary = _summary(epochs=2, reports=1291, records=8, reports_sent=1910, records_sent=12)
        raise ReplayLost(str(broker_lost(settings, "no answer from the broker for 3.0s: refused")), summary)

    monkeypatch.setattr(replay_mod, "replay", lost)
    code = main(["replay", "--bootstrap-servers", "127.0.0.1:1", "--quiet", "--data-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == EXIT_BROKER_LOST
    assert "the broker acknowledged 1,291 of 1,910 reports sent (8 of 12 records)" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("ptt replay: error: lost the Kafka broker at 127.0.0.1:1 mid-run (no answer")


def test_worker_that_lost_the_broker_is_one_line(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch, held_port: int,
                                                 tmp_path: Path) -> None:
    def lost(settings: WorkerSettings, exit_lost: Any) -> int:
        raise broker_lost(settings, "topic ptt.reports is gone: deleted, or the broker restarted")

    monkeypatch.setattr(app_mod, "run_worker", lost)
    from stream_app.cli.local_broker import free_port

    code = main(["worker", "--bootstrap-servers", f"127.0.0.1:{held_port}", "--web-port", str(free_port())])
    err = capsys.readouterr().err
    assert code == EXIT_BROKER_LOST
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"ptt worker: error: lost the Kafka broker at 127.0.0.1:{held_port} mid-run (topic")


class _SlowAdmin:
    """An admin client whose broker shows a created topic only from the ``shown_from``-th
    metadata answer on (None: never)."""

    def __init__(self, shown_from: int | None) -> None:
        self.shown_from, self.answers, self.created = shown_from, 0, set[str]()

    def list_topics(self) -> list[str]:
        return []

    def create_topics(self, new: list[Any]) -> None:
        self.created |= {t.name for t in new}

    def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        self.answers += 1
        shown = self.shown_from is not None and self.answers >= self.shown_from
        return [{"name": n, "error_code": 0 if shown and n in self.created else 3, "topic_id": f"id-{n}"}
                for n in names]

    def close(self) -> None:
        pass


def test_ensure_topics_returns_the_ids_once_the_broker_shows_every_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard's baseline: what the broker showed after creating the topics, not the first
    (possibly lagging) answer; a broker that never shows them is a one-line broker error."""
    from schemas import kafka_io

    admin = _SlowAdmin(shown_from=3)
    monkeypatch.setattr(kafka_io, "connect", lambda *a, **kw: admin)
    settings = ReplaySettings(request_timeout_ms=5000)
    ids = kafka_io.ensure_topics(settings)
    assert admin.answers == 3
    assert ids == {t: f"id-{t}" for t in (settings.reports_topic, settings.queries_topic, settings.truth_topic)}

    never = _SlowAdmin(shown_from=None)
    monkeypatch.setattr(kafka_io, "connect", lambda *a, **kw: never)
    with pytest.raises(BrokerUnavailable, match=r"does not show the topics .* 1s after creating them"):
        kafka_io.ensure_topics(ReplaySettings(request_timeout_ms=1000))
    assert never.answers >= 2


class _Answers:
    """Metadata answers in order (the last one repeats); counts the requests."""

    def __init__(self, *answers: dict[str, str | None]) -> None:
        self.answers, self.asked, self.topics = list(answers), 0, list[str]()

    def topic_ids(self) -> dict[str, str | None]:
        self.asked += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _sink_checking(answers: _Answers) -> ReportSink:
    """A ReportSink's topic check without a producer (the attributes _check_topics reads)."""
    sink = ReportSink.__new__(ReportSink)
    sink._settings, sink._topics, sink._watch, sink.lost = ReplaySettings(), {"t"}, answers, None  # type: ignore[assignment]
    sink._health = BrokerHealth(timeout_s=3.0, now=time.monotonic())  # absences confirmed after 1 s
    sink._failed_since_ack, sink._last_watch, sink._watch_every_s = False, 0.0, 1.0
    return sink


def test_the_replay_sink_confirms_an_absence_before_it_reports_a_loss() -> None:
    """One "unknown topic" answer (at the final check of close(), say) is asked about again:
    shown again, nothing is lost; absent for the confirmation period, the broker is lost."""
    once = _Answers({"t": "id-t"}, {"t": None}, {"t": "id-t"})
    sink = _sink_checking(once)
    sink._check_topics(force=True)
    sink._check_topics(force=True)
    assert once.asked == 3 and sink.lost is None and not sink._health.pending

    gone = _Answers({"t": "id-t"}, {"t": None})
    sink = _sink_checking(gone)
    sink._check_topics(force=True)
    started = time.monotonic()
    with pytest.raises(BrokerLost, match="topic t is gone"):
        sink._check_topics(force=True)
    assert 1.0 <= time.monotonic() - started < 1.0 + 2.0 and gone.asked >= 3
