"""``ptt report`` leads with the span queries' flows (``stream_app.report.flows``,
``summary.format_summary``, ``plots.write_flow_plots``): the flows table comes before every
group's block, the span query's hourly flows first, then the rollups of the 30-s query (hourly,
then 5-minute), then the 30-s epochs; each flow group says what it is and what it is good for
(NOISE-DOMINATED by the plots' one rule, ``summary.noise_note``, applied to each flow); a rollup
names the epochs it sums and its shuffled epsilon is labelled one epoch's, never "per span".

A hand-made hour at two stations, A busy and B quiet: the span query ``hour`` (unary, one report
per device per hour) estimates A's hourly flow of 1,200 with sd 30 and B's 120 with sd 80 (B's
is noise-dominated: 80 >= 120 / 2); the 30-s query ``alp`` has sd 100 per epoch, so its
5-minute rollups have sd 316 and its hourly rollup 1,095 -- noise against flows of 10 to 1,200.
Every figure is exact."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from schemas.estimates import Estimate, EstimateBound
from schemas.wire import GroundTruth
from stream_app import report as R

PT = timezone(timedelta(hours=-8))
T0 = datetime(2026, 11, 18, 8, 0, tzinfo=PT)
E0 = int(T0.timestamp()) // 30
A, B = 400_001, 400_002
PER_EPOCH = {A: 10, B: 1}  # vehicles at each station in each of the hour's 120 epochs


def _row(query: str, epoch: int, station: int, span_s: int, sd: float, mechanism: str = "alp",
         estimator: str = "alp_average", epsilon: float = 1.307, shuffled: float | None = 0.01228) -> Estimate:
    truth = PER_EPOCH[station] * span_s // 30
    return Estimate(query_id=query, query_version=1, mechanism=mechanism, estimator=estimator,  # type: ignore[arg-type]
                    epoch=E0 + epoch, epoch_start=T0 + timedelta(seconds=30 * epoch), span_s=span_s, station=station,
                    estimate=float(truth), sd=sd,
                    bounds=(EstimateBound(confidence=0.95, lower=max(0.0, truth - 2 * sd), upper=truth + 2 * sd),),
                    reports=100, participants=7306, epsilon=epsilon, epsilon_shuffled=shuffled, closed_by="markers",
                    round_count_mismatch=0, late=0, refused=0, missing_batches=0)


def _hour() -> list[Estimate]:
    rows = []
    for s in (A, B):
        rows += [_row("alp", e, s, 30, 100.0) for e in range(120)]
        rows += [_row("alp", e, s, 300, 100.0 * math.sqrt(10)) for e in range(0, 120, 10)]
        rows.append(_row("alp", 0, s, 3600, 100.0 * math.sqrt(120)))
        rows.append(_row("hour", 0, s, 3600, {A: 30.0, B: 80.0}[s], "unary", "unary", 12.15, 0.1844))
    return rows


def _truth() -> list[GroundTruth]:
    return [GroundTruth(epoch=E0 + e, epoch_start=T0 + timedelta(seconds=30 * e), stations=(A, B),
                        flows=(PER_EPOCH[A], PER_EPOCH[B])) for e in range(120)]


def _groups() -> tuple[R.LoadedEstimates, R.LoadedTruth, list[R.GroupSummary]]:
    loaded = R.load_estimates(_hour())
    truth = R.load_truth([t.model_dump_json() for t in _truth()])
    return loaded, truth, R.summarize(R.join(loaded.rows, truth.truth, truth.epoch_ids), loaded.own_span)


def test_the_summary_leads_with_the_span_querys_flows_then_the_rollups() -> None:
    loaded, truth, groups = _groups()
    lines = R.format_summary(groups, loaded, truth).splitlines()
    head = lines.index(next(x for x in lines if x.startswith("flows by span")))
    table = lines[head + 2:lines.index("", head)]
    assert [x.split()[:4] for x in table] == [["hour", "1", "h", "span"], ["alp", "1", "h", "rollup"],
                                              ["alp", "5", "min", "rollup"]]
    titles = [x for x in lines if " / " in x and not x.startswith(" ")]
    assert [t.split(" (")[0] for t in titles] == [
        "hour / unary, flows over 1 h", "alp / alp_average, flows over 1 h", "alp / alp_average, flows over 5 min",
        "alp / alp_average"]  # the span query's flows, the hourly, then the 5-minute rollups, the epochs last
    assert head < lines.index(titles[0])  # the table leads, before every block


def test_each_flow_group_says_what_it_is_and_what_it_is_good_for() -> None:
    loaded, truth, groups = _groups()
    text = R.format_summary(groups, loaded, truth)
    table = {x.split()[0] + " " + x.split()[1] + x.split()[2]: x for x in text.splitlines()
             if x.startswith("  hour ") or x.startswith("  alp ")}
    assert table["hour 1h"].endswith("hourly flows: busy stations only (1 of 2 flows above twice their sd; sd a "
                                     "median 67% of the flow)")  # sd / flow: A's 30 / 1,200, B's 80 / 120
    assert "hourly rollups of a 30-s query: NOISE-DOMINATED: noise, not traffic" in table["alp 1h"]
    assert "5-minute rollups of a 30-s query: NOISE-DOMINATED: noise, not traffic" in table["alp 5min"]
    assert "  good for                 hourly flows: busy stations only" in text
    doc = R.summary_json(groups, loaded, truth)
    span = next(g for g in doc["groups"] if g["query_id"] == "hour")
    assert span["good_for"].startswith("busy stations only") and span["what"].startswith("hourly flows of a span query")
    assert (span["judged_cells"], span["noise_dominated_cells"]) == (2, 1)
    five = next(g for g in doc["groups"] if g["span_s"] == 300)
    assert five["what"] == ("5-minute rollups of a 30-s query (each sums 10 epochs: 10 reports of a device in all of "
                            "them)") and five["good_for"].startswith("NOISE-DOMINATED")


def test_the_one_noise_rule_decides_each_flow() -> None:
    """``noise_dominated`` is ``noise_note`` on one flow: sd at least half of it (a negative flow counts as 0)."""
    assert R.noise_dominated(30.0, 60) and not R.noise_dominated(30.0, 61)
    assert R.noise_dominated(1.0, -5.0) and not R.noise_dominated(None, 5) and not R.noise_dominated(1.0, None)
    assert all(R.noise_dominated(sd, y) == (R.summary.noise_note([sd], [y]) is not None)
               for sd, y in ((5.0, 9), (5.0, 10), (5.0, 11), (0.0, 0)))
    assert R.good_for(10, 0, 0.05) == "per-station traffic (every flow above twice its sd; sd a median 5% of the flow)"
    assert R.good_for(10, 3, 0.4).startswith("busy stations only (7 of 10 flows above twice their sd")
    assert R.good_for(10, 6, 2.0) == "NOISE-DOMINATED: noise, not traffic (6 of 10 flows at most twice their sd)"
    flagged = R.good_for(10, 0, 0.1, "noise-dominated: sd 9 against flows up to 10")  # the set's own note
    assert flagged == "NOISE-DOMINATED: noise, not traffic (sd 9 against flows up to 10)"


def test_a_rollups_epsilon_is_labelled_per_epoch_with_the_epochs_it_sums() -> None:
    """Never "per span" for a rollup: its shuffled figure is one epoch's (the largest), and an hourly
    rollup sums 120 of them; a span query's is per span report."""
    loaded, truth, groups = _groups()
    text = R.format_summary(groups, loaded, truth)
    blocks = {b.splitlines()[0].split(" (")[0]: b for b in text.split("\n\n")}
    hourly = blocks["alp / alp_average, flows over 1 h"]
    assert "rollup: the sum of the query's estimates over 120 epochs, so a device in all of them spends 120 reports; " \
           "epsilon per epoch (not per rollup) v1: 1.307" in hourly
    assert "shuffled epsilon         at most 0.01228 per epoch -- one epoch's figure, not the rollup's: each rollup " \
           "sums 120 epochs" in hourly
    five = blocks["alp / alp_average, flows over 5 min"]
    assert "at most 0.01228 per epoch -- one epoch's figure, not the rollup's: each rollup sums 10 epochs" in five
    assert "per span" not in hourly and "per span" not in five
    span = blocks["hour / unary, flows over 1 h"]
    assert "shuffled epsilon         at most 0.1844 per span report, in 1 of 1 spans" in span


def test_the_flows_plots_come_first_the_span_querys_first(tmp_path: Path) -> None:
    loaded, truth, _ = _groups()
    cells = R.join(loaded.rows, truth.truth, truth.epoch_ids)
    written = R.write_flow_plots(cells, tmp_path, [A], own_span=loaded.own_span)
    assert [p.name for p in written] == ["hour_flows_3600s_unary.png", "alp_flows_3600s_alp_average.png",
                                         "alp_flows_300s_alp_average.png"]


@pytest.mark.parametrize("kind, span_s, words", [
    ("span", 3600, "hourly flows of a span query (one report per device per span)"),
    ("rollup", 300, "5-minute rollups of a 30-s query (each sums 10 epochs: 10 reports of a device in all of them)"),
    ("rollup", 3600, "hourly rollups of a 30-s query (each sums 120 epochs: 120 reports of a device in all of them)"),
])
def test_what_a_flow_is(kind: str, span_s: int, words: str) -> None:
    assert R.flow_what(kind, span_s) == words
    assert R.flow_rank("span", 300) < R.flow_rank("rollup", 3600) < R.flow_rank("rollup", 300) < \
        R.flow_rank("epoch", 30)
