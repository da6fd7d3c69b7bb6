"""A span query end to end through the real shuffler: ``ptt demo --via-shuffler`` (replay ->
``ptt shuffler`` -> ``ptt worker``, each a process of its own, on the demo's embedded broker)
with a 5-minute unary span query (``unary@300``: 10 epochs a span) beside a 30-s one, against the
same seeded demo without the shuffler."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from estimators import get_spec
from estimators.ledger import report_epsilon_shuffled
from producers.replay import default_fleet, default_queries, load_day
from producers.settings import ReplaySettings
from stream_app.settings import WorkerSettings
from stream_app.worker.estimate import round_down_2sig

from .stream_helpers import QUICK_DEMO, same_values

pytestmark = pytest.mark.integration

EPOCHS = 25  # spans [e0, e0+10) and [e0+10, e0+20) whole; the replay ends inside [e0+20, e0+30)
MECHANISMS = "unary,unary@300"


def _start_demo(tmp: Path, *flags: str) -> subprocess.Popen[str]:
    """A demo in the background. Its ports are its own choice: two demos side by side race for
    the free ports they pick, and the demo picks another when one it chose was taken meanwhile
    (an explicit ``--metrics-port`` it may not change)."""
    tmp.mkdir()
    return subprocess.Popen([sys.executable, "-m", "stream_app.cli", "demo", "--speed", "0",  # noqa: S603
                             "--max-epochs", str(EPOCHS), "--exit-when-done", "--stations", "16",
                             "--out", str(tmp / "out"), *QUICK_DEMO, "--query-mechanisms", MECHANISMS, "--no-plots",
                             *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)


def _finish(proc: subprocess.Popen[str], tmp: Path) -> list[dict[str, Any]]:
    """The demo's published rows, once it has exited 0 by itself (bounded: killed past 300 s),
    and without having given up on a window the worker never closed."""
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "closed no further epoch" not in err, err[-3000:]  # the demo waited for a window in vain
    return [json.loads(line) for line in (tmp / "out" / "estimates.jsonl").read_text().splitlines()]


def test_a_span_query_through_the_shuffler_is_released_once_per_span_with_its_span_figure(tmp_path: Path) -> None:
    """``ptt demo --via-shuffler --query-mechanisms unary,unary@300 --max-epochs 25``: each whole
    span is published once -- a row per station at the span's first epoch, closed by markers,
    its participants the whole fleet (one report per device per span) -- with ``epsilon_shuffled``
    the span report's figure (:func:`estimators.ledger.report_epsilon_shuffled` at the query's
    P passages), not a 30-s report's; the span the replay ended inside is withheld
    ``interrupted`` (the demo does not wait for it in vain); and every row, the 30-s query's
    too, equals the direct demo's of the same seed but ``epsilon_shuffled`` and ``release``."""
    started = time.monotonic()
    direct = _start_demo(tmp_path / "direct", "--no-shuffler")
    via = _start_demo(tmp_path / "via")
    rs = ReplaySettings(synthetic_stations=16, data_dir=tmp_path / "data", query_mechanisms=MECHANISMS)
    day = load_day(rs)  # the demo's day and queries, from the same settings (planned while the demos run)
    fleet = default_fleet(day, rs)
    queries = {q.query_id: q for q in default_queries(day, fleet, rs.mechanisms, rs.flow_day_budget)}
    plain_rows, via_rows = _finish(direct, tmp_path / "direct"), _finish(via, tmp_path / "via")
    elapsed = time.monotonic() - started

    span, live = queries["unary-5min"], queries["unary-day"]
    assert span.span_s == 300 and span.epochs_per_span == 10 and span.passages == 10 and live.span_s == 30
    epochs = [int(e) for e in day.epochs[:EPOCHS]]
    e0 = epochs[0]
    assert e0 % 10 == 0 and epochs == list(range(e0, e0 + EPOCHS))  # the replay starts on a span's first epoch
    whole, cut = [e0, e0 + 10], e0 + 20
    names = {q.query_id: get_spec(q.mechanism).estimator_names for q in queries.values()}
    # (query, epoch, span_s, station, estimator): the span query's rows at its spans' first epochs (no
    # rollup of them), the 30-s query's at every epoch and its two whole 5-minute rollups
    want = {(span.query_id, e, 300, s, n) for e in [*whole, cut] for s in span.sensors for n in names[span.query_id]}
    want |= {(live.query_id, e, 30, s, n) for e in epochs for s in live.sensors for n in names[live.query_id]}
    want |= {(live.query_id, e, 300, s, n) for e in whole for s in live.sensors for n in names[live.query_id]}

    def keyed(rows: list[dict[str, Any]]) -> dict[tuple[str, int, int, int, str], dict[str, Any]]:
        def key(e: dict[str, Any]) -> tuple[str, int, int, int, str]:
            return e["query_id"], e["epoch"], e["span_s"], e["station"], e["estimator"]

        counts = Counter(key(e) for e in rows)
        assert counts.keys() == want and set(counts.values()) == {1}, counts.most_common(3)  # each row once
        return {key(e): e for e in rows}

    plain, shuffled = keyed(plain_rows), keyed(via_rows)
    delta = WorkerSettings().shuffle_delta
    figures = {}
    computed: dict[tuple[str, int], float] = {}  # (query, participants) -> report_epsilon_shuffled's figure
    for key, e in shuffled.items():
        qid, epoch, span_s = key[:3]
        q = queries[qid]
        if qid == span.query_id and epoch == cut:  # the span the replay ended inside: withheld, not waited for
            assert e["withheld"] is not None and "interrupted" in e["withheld"], e
            assert e["closed_by"] == "markers" and e["participants"] == 0 and e["epsilon_shuffled"] is None, e
            continue
        assert e["withheld"] is None and e["closed_by"] == "markers" and e["release"] == "aggregate", e
        if span_s != q.span_s:  # a rollup of the 30-s query: compared with the direct path's below
            continue
        n = e["participants"]
        if qid == span.query_id:  # every device of the fleet reports once a span
            assert n == fleet, e
        if (qid, n) not in computed:  # a function of the query and the crowd: once per pair, not per row
            computed[qid, n] = report_epsilon_shuffled(q.spec, q.build(), q.n_stations, round_down_2sig(n),
                                                       "aggregate", delta, q.passages)
        figure = computed[qid, n]
        assert e["epsilon_shuffled"] == figure, (e, figure)
        figures[qid] = figure
    # the span's figure is its span account's, larger than a 30-s report's at the same crowd
    thirty = span.spec.shuffled_epsilon(span.build(), span.n_stations, round_down_2sig(fleet), delta,
                                        release="aggregate")
    assert math.isfinite(thirty) and figures[span.query_id] > thirty, (figures, thirty)
    # the same estimates as the direct path (its cut span withheld interrupted too)
    shuffle_only = ("epsilon_shuffled", "release")
    for key, e in plain.items():
        assert e["epsilon_shuffled"] is None and e["release"] is None, e
        assert same_values({k: v for k, v in shuffled[key].items() if k not in shuffle_only},
                     {k: v for k, v in e.items() if k not in shuffle_only}), (key, e, shuffled[key])
    log = (tmp_path / "via" / "out" / "shuffler.log").read_text()
    # one slot per 30-s epoch and per span (the cut one released as interrupted markers); nothing withheld
    assert f"{EPOCHS + len(whole) + 1} epochs released" in log and "withheld epochs: none" in log, log[-2000:]
    print(f"two demos of {EPOCHS} epochs, direct and through the shuffler, side by side: {elapsed:.1f} s")
