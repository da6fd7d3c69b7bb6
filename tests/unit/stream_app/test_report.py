"""``ptt report`` without a broker (``stream_app.report``, ``stream_app/cli/report.py``).

A small hand-made case (two queries, two stations, three epochs; a duplicate, a withheld
estimate, a cell without ground truth, lines that are not estimates) is checked number by
number: cells, coverage per level, mean absolute error, bias, RMSE, mean widths, withheld
and missing-truth counts, and that deduplication keeps the last record. Then the summary of
a seeded Sampling Privacy run through the statistics core is compared with numpy applied
directly to the same arrays; the plots are read back as images of the promised size; the
filters, the station choice and the command line (exit code 5 for an input file that cannot
be read, 2 for other bad inputs) are checked.

Randomness: one seeded tally; every assertion is an exact identity.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

import estimators as E
from schemas.estimates import Estimate, EstimateBound
from schemas.wire import GroundTruth
from stream_app import report as R
from stream_app.cli import main
from stream_app.cli.errors import EXIT_INPUT

PT = timezone(timedelta(hours=-8))
T0 = datetime(2026, 11, 18, 8, 0, tzinfo=PT)
E0 = int(T0.timestamp()) // 30
A, B = 400_001, 400_002
WITHHELD = "fewer than 20 participating vehicles (3)"


def _est(epoch: int, station: int, estimate: float | None, b95: tuple[float, float] | None = None,
         b99: tuple[float, float] | None = None, *, query: str = "q", version: int = 1, mechanism: str = "sp",
         estimator: str = "sp_difference", withheld: str | None = None, epsilon: float = 2.0, sd: float = 1.0,
         span_s: int = 30) -> Estimate:
    bounds = [] if withheld else [EstimateBound(confidence=c, lower=b[0], upper=b[1])
                                  for c, b in ((0.95, b95), (0.99, b99)) if b is not None]
    return Estimate(query_id=query, query_version=version, mechanism=mechanism, estimator=estimator,  # type: ignore[arg-type]
                    epoch=E0 + epoch, epoch_start=T0 + timedelta(seconds=30 * epoch), station=station,
                    estimate=None if withheld else estimate, sd=None if withheld else sd, bounds=tuple(bounds),
                    span_s=span_s,
                    reports=100, participants=100, epsilon=epsilon, withheld=withheld, closed_by="markers",
                    round_count_mismatch=0, late=0, refused=0, missing_batches=0)


def _truth(epoch: int, flows: dict[int, int]) -> GroundTruth:
    return GroundTruth(epoch=E0 + epoch, epoch_start=T0 + timedelta(seconds=30 * epoch),
                       stations=tuple(flows), flows=tuple(flows.values()))


def _lines(records: list[Estimate | GroundTruth | bytes]) -> list[bytes]:
    return [r if isinstance(r, bytes) else r.model_dump_json().encode() for r in records]


# query q (sp_difference): epoch 0 at A first published as 100, then republished as 10;
# epoch 1 at B withheld; epoch 2 at A has no ground truth. Query r (rr): station A only.
ESTIMATES = _lines([
    _est(0, A, 100.0, (90, 110), (85, 115)),  # replaced below: dedupe keeps the last
    _est(0, A, 10.0, (8, 12), (6, 14)),  # truth 11: both levels cover, error -1
    _est(0, B, 5.0, (4, 6), (3, 9)),  # truth 8: only 99% covers, error -3
    b"not json at all",
    _est(1, A, 20.0, (18, 22), (15, 25)),  # truth 30: neither covers, error -10
    _est(1, B, None, withheld=WITHHELD),
    b"",  # blank lines are skipped, not counted
    _est(2, A, 7.0, (5, 9), (4, 10)),  # no truth for A at epoch 2
    _est(2, B, 2.0, (0, 4), (0, 6)),  # truth 3: both cover, error -1
    _truth(0, {A: 11}),  # a truth record among the estimates is not an estimate
    _est(0, A, 4.0, (1, 6), (0, 12), query="r", mechanism="rr", estimator="rr", epsilon=3.0),  # truth 11
    _est(1, A, 31.0, (25, 35), (22, 40), query="r", mechanism="rr", estimator="rr", epsilon=3.0),  # truth 30
])
TRUTH = _lines([_truth(0, {A: 11, B: 8}), _truth(1, {A: 30, B: 0}), _truth(2, {B: 3}), b"{broken"])


def _groups() -> dict[tuple[str, str], R.GroupSummary]:
    loaded = R.load_estimates(ESTIMATES)
    truth = R.load_truth(TRUTH)
    return {(g.query_id, g.estimator): g for g in R.summarize(R.join(loaded.rows, truth.truth))}


def test_loading_counts_and_dedupe_keeps_the_last() -> None:
    loaded = R.load_estimates(ESTIMATES)
    assert (loaded.read, loaded.invalid, loaded.duplicates, loaded.filtered_out) == (11, 2, 1, 0)
    assert len(loaded.rows) == 8
    a0 = next(r for r in loaded.rows if r.key == ("q", 1, 30, E0, A, "sp_difference"))
    assert a0.estimate == 10.0 and a0.bound(0.95) == (8, 12) and a0.bound(0.99) == (6, 14)
    assert a0.epoch_start == T0 and a0.epoch_start.utcoffset() == timedelta(hours=-8)
    # a new version of the same epoch is a different estimate, not a duplicate
    again = R.load_estimates([*ESTIMATES, *_lines([_est(0, A, 9.0, (7, 11), (5, 13), version=2)])])
    assert len(again.rows) == 9 and again.duplicates == 1
    truth = R.load_truth(TRUTH)
    assert (truth.epochs, truth.read, truth.invalid) == (3, 4, 1)
    assert truth.truth == {(E0, A): 11, (E0, B): 8, (E0 + 1, A): 30, (E0 + 1, B): 0, (E0 + 2, B): 3}
    later = R.load_truth([*TRUTH, *_lines([_truth(2, {B: 4})])])  # a later record of an epoch replaces it
    assert later.truth[(E0 + 2, B)] == 4 and later.epochs == 3
    only_b = R.load_truth(TRUTH, stations={B})  # only the stations the estimates need
    assert only_b.truth == {(E0, B): 8, (E0 + 1, B): 0, (E0 + 2, B): 3} and only_b.epochs == 3


def test_summary_numbers_on_the_hand_made_case() -> None:
    g = _groups()
    q = g[("q", "sp_difference")]
    assert (q.cells, q.withheld, q.without_truth, q.with_truth, q.stations, q.epochs) == (6, 1, 1, 4, 2, 3)
    assert q.withheld_reasons == {"too_few_participants": 1}
    assert q.left_out == {"withheld: too_few_participants": 1, R.NO_READING: 1}  # A at epoch 2: no reading
    assert q.coverage == {0.95: 2 / 4, 0.99: 3 / 4}
    assert q.mae == 15 / 4 and q.bias == -15 / 4
    assert q.rmse == pytest.approx(math.sqrt((1 + 9 + 100 + 1) / 4), rel=1e-15)
    assert q.mean_width == {0.95: pytest.approx(18 / 5), 0.99: pytest.approx(36 / 5)}  # over the 5 published
    assert (q.mechanism, q.versions, q.epsilon, q.epsilon_by_version) == ("sp", (1,), 2.0, {1: 2.0})
    assert (q.first_epoch_start, q.last_epoch_start) == (T0, T0 + timedelta(seconds=60))
    r = g[("r", "rr")]
    assert (r.cells, r.withheld, r.without_truth, r.with_truth) == (2, 0, 0, 2)
    assert r.coverage == {0.95: 0.5, 0.99: 1.0}  # 11 outside [1, 6], inside [0, 12]; 30 inside both
    assert (r.mae, r.bias, r.epsilon) == (4.0, -3.0, 3.0)
    assert list(g) == [("q", "sp_difference"), ("r", "rr")]


def test_summary_json_and_text_say_the_same() -> None:
    loaded, truth = R.load_estimates(ESTIMATES), R.load_truth(TRUTH)
    groups = R.summarize(R.join(loaded.rows, truth.truth))
    doc = json.loads(json.dumps(R.summary_json(groups, loaded, truth)))
    q = doc["groups"][0]
    assert q["coverage"] == {"0.95": 0.5, "0.99": 0.75} and q["cells"] == 6 and q["withheld"] == 1
    assert q["without_truth"] == 1 and q["mae"] == 3.75 and q["epsilon"] == 2.0
    assert q["first_epoch_start"] == "2026-11-18T08:00:00-08:00"
    assert doc["estimates"] == {"read": 11, "kept": 8, "duplicates": 1, "filtered_out": 0, "not_selected": {},
                                "kept_by_span": {"30": 8}, "invalid": 2}
    assert doc["truth"] == {"epochs": 3, "read": 4, "invalid": 1}
    text = R.format_summary(groups, loaded, truth)
    assert "q / sp_difference (sp; epsilon per epoch v1: 2)" in text
    assert "95% bounds" in text and "coverage  50.0%" in text and "coverage  75.0%" in text
    assert "MAE 3.75" in text and "withheld                 1" in text and "without ground truth     1" in text


def test_without_truth_coverage_and_error_are_not_computed() -> None:
    loaded = R.load_estimates(ESTIMATES)
    q = R.summarize(R.join(loaded.rows, {}))[0]
    assert q.coverage == {0.95: None, 0.99: None} and q.mae is None and q.rmse is None
    assert q.without_truth == 5 and q.with_truth == 0 and q.mean_width[0.95] == pytest.approx(3.6)
    assert "ground truth: none given" in R.format_summary([q]) and "n/a" in R.format_summary([q])


def test_filters() -> None:
    only_r = R.load_estimates(ESTIMATES, R.Selection(queries=frozenset({"r"})))
    assert {r.query_id for r in only_r.rows} == {"r"} and only_r.filtered_out == 7 and only_r.duplicates == 0
    only_b = R.load_estimates(ESTIMATES, R.Selection(stations=frozenset({B})))
    assert {r.station for r in only_b.rows} == {B} and len(only_b.rows) == 3
    only_rr = R.load_estimates(ESTIMATES, R.Selection(estimators=frozenset({"rr", "alp_gls"})))
    assert {r.estimator for r in only_rr.rows} == {"rr"} and len(only_rr.rows) == 2
    both = R.load_estimates(ESTIMATES, R.Selection(queries=frozenset({"q"}), stations=frozenset({A})))
    assert [(r.query_id, r.station, r.epoch - E0) for r in both.rows] == [("q", A, 0), ("q", A, 1), ("q", A, 2)]
    assert R.load_estimates(ESTIMATES, R.Selection(queries=frozenset({"nope"}))).rows == []


def test_summary_matches_numpy_on_a_seeded_sampling_privacy_run() -> None:
    """300 epochs at 3 stations: the statistics core's own estimates and score bounds, summarized."""
    rng = np.random.default_rng(20261118)
    mech = E.sampling_privacy(3)
    est = E.sp_difference(mech)
    n_veh, epochs = 400, 300
    truths = rng.integers(0, 60, size=(epochs, 3))
    estimates, rows_truth = [], []
    values_all, lo_all, hi_all = [], [], []
    for i in range(epochs):
        tc = np.concatenate([[n_veh - truths[i].sum()], truths[i]]).astype(np.int64)
        counts = E.station_counts(mech, mech.tally(rng, tc))
        v = est.estimate(counts, n_veh)
        (lo95, hi95), (lo99, hi99) = est.score_interval(v, n_veh, 0.95), est.score_interval(v, n_veh, 0.99)
        for j, s in enumerate((A, B, 400_003)):
            estimates.append(_est(i, s, float(v[j]), (float(lo95[j]), float(hi95[j])),
                                  (float(lo99[j]), float(hi99[j]))))
        rows_truth.append(_truth(i, {A: int(truths[i, 0]), B: int(truths[i, 1]), 400_003: int(truths[i, 2])}))
        values_all.append(v)
        lo_all.append((lo95, lo99))
        hi_all.append((hi95, hi99))
    loaded = R.load_estimates(_lines(estimates))
    g = R.summarize(R.join(loaded.rows, R.load_truth(_lines(rows_truth)).truth))[0]
    v = np.array(values_all)
    lo, hi = np.array(lo_all), np.array(hi_all)  # (epochs, level, station)
    assert g.cells == g.with_truth == 900 and g.withheld == 0
    for k, lvl in enumerate((0.95, 0.99)):
        covered = (lo[:, k] <= truths) & (truths <= hi[:, k])
        assert g.coverage[lvl] == pytest.approx(covered.mean(), abs=1e-15)
        assert g.mean_width[lvl] == pytest.approx((hi[:, k] - lo[:, k]).mean(), rel=1e-12)
    assert g.mae == pytest.approx(np.abs(v - truths).mean(), rel=1e-12)
    assert g.bias == pytest.approx((v - truths).mean(), rel=1e-9, abs=1e-12)
    assert 0.9 < g.coverage[0.95] <= g.coverage[0.99]  # sanity: these are honest bounds


def test_series_breaks_lines_at_withheld_epochs_and_gaps() -> None:
    loaded, truth = R.load_estimates(ESTIMATES), R.load_truth(TRUTH)
    cells = R.join(loaded.rows, truth.truth)
    s = R.series_for(cells, "q", B, "sp_difference", every=1)
    assert s is not None and s.epoch_s == 30 and s.every == 1 and s.utc_offsets == ("UTC\u221208:00",)
    assert s.times == [(T0 + timedelta(seconds=30 * i)).replace(tzinfo=None) for i in range(3)]  # wall clock
    assert s.truth == [8.0, 0.0, 3.0]
    assert s.estimate[0] == 5.0 and math.isnan(s.estimate[1]) and s.estimate[2] == 2.0  # withheld: a gap
    assert s.bands[0.99][0][2] == 0.0 and math.isnan(s.bands[0.99][1][1])
    assert (s.withheld, s.covered[0.95], s.covered[0.99], s.mae) == (1, (1, 2), (2, 2), 2.0)
    # a missing epoch in the data breaks the line with a NaN point
    gap = R.series_for([c for c in cells if c.row.epoch != E0 + 1], "q", A, "sp_difference", every=1)
    assert gap is not None and len(gap.times) == 3 and math.isnan(gap.estimate[1]) and gap.times[1] == gap.times[0]
    thin = R.series_for(cells, "q", A, "sp_difference", every=2)
    assert thin is not None and thin.estimate == [10.0, 7.0] and thin.covered[0.95] == (1, 2)  # facts: all epochs
    assert R.series_for(cells, "q", 999, "sp_difference") is None


def test_busiest_stations_by_truth_then_by_estimate() -> None:
    loaded, truth = R.load_estimates(ESTIMATES), R.load_truth(TRUTH)
    cells = R.join(loaded.rows, truth.truth)
    assert R.busiest_stations(cells, 6) == [A, B]  # 11 + 30 against 8 + 0 + 3, counted once per epoch
    assert R.busiest_stations(cells, 1) == [A]
    no_truth = R.join(loaded.rows, {})
    assert R.busiest_stations(no_truth, 2) == [A, B]  # by the estimates
    assert R.plot_stations(cells, {B, 12345}, 6) == [B]
    assert R.plot_stations(cells, None, 0) == []


def test_plots_are_pngs_of_the_promised_size(tmp_path: Path) -> None:
    loaded, truth = R.load_estimates(ESTIMATES), R.load_truth(TRUTH)
    cells = R.join(loaded.rows, truth.truth)
    written = R.write_plots(cells, tmp_path, [A, B])
    assert sorted(p.name for p in written) == sorted(
        [f"q_{A}_sp_difference.png", f"q_{B}_sp_difference.png", f"r_{A}_rr.png"])  # r has no cell at B
    for p in written:
        img = mpimg.imread(p)
        assert img.shape[:2] == (R.FIG_HEIGHT_PX, R.FIG_WIDTH_PX) and p.stat().st_size > 10_000
        assert float(img[..., :3].std()) > 0.05  # not a blank canvas
    only = R.write_plots(cells, tmp_path / "sel", [A], estimators=["rr"])
    assert [p.name for p in only] == [f"r_{A}_rr.png"]


def test_alp_plot_defaults_to_the_average_and_overlays_gls(tmp_path: Path) -> None:
    recs = [_est(i, A, 10.0 + i, (5, 15), (3, 20), query="alp-day", mechanism="alp", estimator=name)
            for i in range(40) for name in ("alp_average", "alp_gls", "alp_yhat", "alp_bottom")]
    cells = R.join(R.load_estimates(_lines(list(recs))).rows, {(E0 + i, A): 12 for i in range(40)})
    written = R.write_plots(cells, tmp_path, [A], with_gls=True)
    assert [p.name for p in written] == [f"alp-day_{A}_alp_average.png"]
    assert mpimg.imread(written[0]).shape[:2] == (R.FIG_HEIGHT_PX, R.FIG_WIDTH_PX)


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_cli_writes_plots_and_summaries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    est = _write(tmp_path / "est.jsonl", ESTIMATES)
    truth = _write(tmp_path / "truth.jsonl", TRUTH)
    out = tmp_path / "report"
    assert main(["report", "--estimates", str(est), "--truth", str(truth), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("estimates: 11 records read, 8 kept; 1 duplicates dropped")
    assert (out / "summary.txt").read_text() in printed
    doc = json.loads((out / "summary.json").read_text())
    assert [g["cells"] for g in doc["groups"]] == [6, 2]
    assert sorted(doc["plots"]) == sorted(p.name for p in out.glob("*.png")) and len(doc["plots"]) == 3
    # filters on the command line: repeatable and comma-separated
    out2 = tmp_path / "only-b"
    assert main(["report", "--estimates", str(est), "--truth", str(truth), "--out", str(out2),
                 "--station", f"{B}", "--station", f"{A},{B}", "--query", "q", "--stations", "1"]) == 0
    doc2 = json.loads((out2 / "summary.json").read_text())
    assert [(g["query_id"], g["cells"]) for g in doc2["groups"]] == [("q", 6)]
    assert len(doc2["plots"]) == 2  # --station names the stations: all of them are plotted
    out3 = tmp_path / "none"
    assert main(["report", "--estimates", str(est), "--no-truth", "--stations", "0", "--out", str(out3)]) == 0
    doc3 = json.loads((out3 / "summary.json").read_text())
    assert doc3["plots"] == [] and doc3["truth"] is None and doc3["groups"][0]["coverage"]["0.95"] is None
    # --no-plots: the summary alone, even of stations named (which are otherwise all plotted)
    out4 = tmp_path / "no-plots"
    capsys.readouterr()
    assert main(["report", "--estimates", str(est), "--truth", str(truth), "--out", str(out4), "--station", f"{A}",
                 "--no-plots"]) == 0
    doc4 = json.loads((out4 / "summary.json").read_text())
    assert doc4["plots"] == [] and not list(out4.glob("*.png")) and [g["cells"] for g in doc4["groups"]] == [3, 2]
    assert "wrote 0 plots (--no-plots), summary.txt and summary.json" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["missing estimates", "missing truth", "estimates a directory"])
def test_cli_missing_input_file_is_exit_5_with_one_line(case: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The exit code of every command for an input file that cannot be read (README), found
    before anything is read or written."""
    est = _write(tmp_path / "est.jsonl", ESTIMATES)
    truth = _write(tmp_path / "truth.jsonl", TRUTH)
    (tmp_path / "dir.jsonl").mkdir()
    argv, named = {
        "missing estimates": (["--estimates", str(tmp_path / "nope.jsonl"), "--truth", str(truth)], "nope.jsonl"),
        "missing truth": (["--estimates", str(est), "--truth", str(tmp_path / "nope.jsonl")], "nope.jsonl"),
        "estimates a directory": (["--estimates", str(tmp_path / "dir.jsonl"), "--no-truth"], "dir.jsonl"),
    }[case]
    out = tmp_path / "out"
    assert main(["report", *argv, "--out", str(out)]) == EXIT_INPUT == 5
    err = capsys.readouterr().err
    assert err.startswith("ptt report: error: cannot read ") and err.count("\n") == 1, err
    assert named in err
    assert not out.exists()


@pytest.mark.parametrize("case", ["no match", "empty", "not estimates", "truth and no-truth"])
def test_cli_exit_code_2_with_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    est = _write(tmp_path / "est.jsonl", ESTIMATES)
    truth = _write(tmp_path / "truth.jsonl", TRUTH)
    argv = {
        "no match": ["--estimates", str(est), "--truth", str(truth), "--query", "nope"],
        "empty": ["--estimates", str(_write(tmp_path / "empty.jsonl", [])), "--no-truth"],
        "not estimates": ["--estimates", str(truth), "--no-truth"],
        "truth and no-truth": ["--estimates", str(est), "--truth", str(truth), "--no-truth"],
    }[case]
    out = tmp_path / "out"
    assert main(["report", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ptt report: error: ") and err.count("\n") == 1, err
    assert not (out / "summary.json").exists()


def test_cli_needs_an_input_source(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["report"])
    assert exc.value.code == 2 and "--from-topic" in capsys.readouterr().err


def test_cli_unreachable_broker_is_one_line_and_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stream_app.cli.local_broker import free_port

    code = main(["report", "--from-topic", "--bootstrap-servers", f"127.0.0.1:{free_port()}",
                 "--bootstrap-timeout-ms", "300", "--connect-attempts", "1", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 3 and err.startswith("ptt report: error: cannot reach the Kafka broker") and err.count("\n") == 1


def test_importing_the_command_line_loads_neither_matplotlib_nor_kafka(tmp_path: Path) -> None:
    """Nor does a report with ``--no-plots``."""
    est = _write(tmp_path / "est.jsonl", ESTIMATES)
    code = ("import sys; from stream_app.cli import build_parser, main; build_parser(); "
            "print('matplotlib' in sys.modules, 'kafka' in sys.modules); "
            f"main(['report', '--estimates', {str(est)!r}, '--no-truth', '--no-plots', '--out', {str(tmp_path)!r}]); "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[:2] == ["False", "False"] and out.split()[-1] == "False", out


def test_frames_and_their_long_table_load_as_their_rows(tmp_path: Path) -> None:
    """The report reads estimate frames (``estimates_of_frames``) and the long-form Parquet of
    ``ptt subscribe --parquet``/``ptt demo`` (``estimates_of_long_table``) as the JSON rows of
    the same epochs: a published epoch with no-source-data cells and a withheld one; a value
    that is not a frame is counted unreadable; a Parquet file of anything else is refused in
    one line, and so is it through ``ptt report`` (exit 5)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stream_app.subscribe import write_frames
    from stream_app.worker.frames import encode_frame
    from tests.unit.stream_app.worker.test_frames import make_query, make_result

    q = make_query(16)
    results = [make_result(q), make_result(q, withheld="fewer than 20 participating vehicles (7)",
                                           withheld_code="too_few_participants")]
    results[1] = dataclasses.replace(results[1], epoch=results[0].epoch + 1)
    rows = R.load_estimates([value for res in results for _, value in res.render()])
    assert {r.withheld is None for r in rows.rows} == {True, False} and len(rows.rows) == 2 * 16 * 4
    frames = [encode_frame(res) for res in results]
    got = R.load_estimates(R.estimates_of_frames([frames[0], b"not a frame", frames[1]]))
    assert got.rows == rows.rows and got.invalid == 1
    day = tmp_path / "day.parquet"
    write_frames(frames, day, "parquet")
    assert R.load_estimates(R.estimates_of_long_table(day)).rows == rows.rows
    out = tmp_path / "report"
    assert main(["report", "--estimates", str(day), "--no-truth", "--stations", "0", "--out", str(out)]) == 0
    doc = json.loads((out / "summary.json").read_text())
    assert sum(g["cells"] for g in doc["groups"]) == 2 * 16 * 4 and sum(g["withheld"] for g in doc["groups"]) == 64
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1]}), other)
    with pytest.raises(ValueError, match="not a long-form estimates file"):
        list(R.estimates_of_long_table(other))
    assert main(["report", "--estimates", str(other), "--no-truth", "--out", str(out)]) == EXIT_INPUT


def test_the_shuffled_epsilon_is_the_largest_over_the_epochs_that_carry_one(tmp_path: Path) -> None:
    """``epsilon_shuffled`` per (query, estimator): the largest over the epochs that carry one,
    and in how many; "not attested" when none does (the direct replay); a long-form file
    written before the column existed still loads (as null)."""
    import pyarrow.parquet as pq

    from stream_app.subscribe import write_frames
    from stream_app.worker.frames import encode_frame
    from tests.unit.stream_app.worker.test_frames import make_query, make_result

    shuffled = [_est(e, A, 5.0, (4, 6)).model_copy(update={"epsilon_shuffled": eps})
                for e, eps in ((0, 0.5), (1, 0.75), (2, None))]
    (g,) = R.summarize(R.join(R.load_estimates(_lines([*shuffled])).rows, {}))
    assert (g.epsilon_shuffled, g.shuffled_epochs, g.epochs) == (0.75, 2, 3)
    assert g.to_json()["epsilon_shuffled"] == 0.75 and g.to_json()["shuffled_epochs"] == 2
    assert "shuffled epsilon         at most 0.75 per epoch, in 2 of 3 epochs (assumes the shuffler does not " \
           "collude" in R.format_summary([g])
    (plain,) = R.summarize(R.join(R.load_estimates(_lines([_est(0, A, 5.0, (4, 6))])).rows, {}))
    assert plain.epsilon_shuffled is None and "shuffled epsilon         not attested" in R.format_summary([plain])
    day = tmp_path / "old.parquet"
    write_frames([encode_frame(make_result(make_query(4)))], day, "parquet")
    pq.write_table(pq.read_table(day).drop_columns(["epsilon_shuffled"]), day)  # as written before the column
    assert {r.epsilon_shuffled for r in R.load_estimates(R.estimates_of_long_table(day)).rows} == {None}


def test_noise_dominated_estimators_say_so_in_the_summary_and_on_their_plots(tmp_path: Path) -> None:
    """An estimator whose per-epoch sd is at least half the largest true count is flagged (the
    summary's text and JSON, the plot's subtitle); one with a small sd is not."""
    noisy = [_est(i, A, 50.0 * (-1) ** i, (0, 300), (0, 400), query="n", mechanism="alp", estimator="alp_average",
                  sd=135.0) for i in range(4)]
    quiet = [_est(i, A, 10.0 + 20 * i, (5, 99), (3, 99), sd=3.0) for i in range(4)]
    truth = R.load_truth(_lines([_truth(i, {A: 10 + 20 * i}) for i in range(4)]))  # counts up to 70
    cells = R.join(R.load_estimates(_lines([*noisy, *quiet])).rows, truth.truth)
    groups = {g.query_id: g for g in R.summarize(cells)}
    note = "noise-dominated: sd 135 against counts up to 70"
    assert groups["n"].noise == note and groups["q"].noise is None
    assert note in R.format_summary(list(groups.values()))
    assert [g["noise"] for g in R.summary_json(list(groups.values()))["groups"]] == [note, None]
    s = R.series_for(cells, "n", A, "alp_average")
    assert s is not None and s.noise == note
    assert (q := R.series_for(cells, "q", A, "sp_difference")) is not None and q.noise is None
    assert R.plot_series(s, tmp_path / "n.png").is_file()


def test_a_rollup_is_its_own_row_and_group_never_the_epochs() -> None:
    """A rollup row (span_s 300) has the epoch of its first epoch: it is kept as its own row (the
    span is in the key) and summarized in its own group, never replacing that epoch's row."""
    loaded = R.load_estimates(_lines([_est(0, A, 10.0, (8, 12)), _est(0, A, 300.0, (250, 350), span_s=300)]))
    assert sorted((r.span_s, r.estimate) for r in loaded.rows) == [(30, 10.0), (300, 300.0)]
    assert loaded.filtered_out == 0 and loaded.duplicates == 0 and loaded.by_span() == {30: 1, 300: 1}
    groups = R.summarize(R.join(loaded.rows, None), loaded.own_span)
    assert [(g.span_s, g.kind, g.cells) for g in groups] == [(30, "epoch", 1), (300, "rollup", 1)]
    assert all(g.left_out == {R.NO_TRUTH_GIVEN: 1} for g in groups)


# Flows scored by hand. Query u (rr, 30-s epochs) has 5-minute rollups (10 epochs); query h is a span
# query of 10 minutes (20 epochs; no 30-s rows). Truth: A has 3 vehicles in each of epochs 0-9 and 5 in
# each of 10-19; B has 1 in each epoch except epoch 13, where its detector gave no reading (no_truth).
def _flow_truth() -> list[bytes]:
    recs = []
    for e in range(20):
        t = _truth(e, {A: 3 if e < 10 else 5, B: 1})
        recs.append(t.model_copy(update={"no_truth": (B,)}) if e == 13 else t)
    return _lines(recs)


FLOWS = _lines([
    _est(0, A, 28.0, (20, 36), (15, 40), query="u", mechanism="rr", estimator="rr", span_s=300),  # 30: both, -2
    _est(10, A, 70.0, (55, 65), (45, 75), query="u", mechanism="rr", estimator="rr", span_s=300),  # 50: 99 only, +20
    _est(0, B, 9.0, (5, 15), (2, 20), query="u", mechanism="rr", estimator="rr", span_s=300),  # 10: both, -1
    _est(10, B, 12.0, (0, 30), (0, 40), query="u", mechanism="rr", estimator="rr", span_s=300),  # no truth (13)
    _est(0, A, 7.0, (2, 9), (1, 12), query="u", mechanism="rr", estimator="rr"),  # an epoch: truth 3
    _est(0, A, 100.0, (85, 115), (80, 120), query="h", mechanism="rr", estimator="rr", span_s=600),  # 80: 99, +20
    _est(0, B, None, query="h", mechanism="rr", estimator="rr", span_s=600, withheld=WITHHELD),
])


def _flow_groups(truth: list[bytes] | None = None) -> dict[tuple[str, int], R.GroupSummary]:
    loaded = R.load_estimates(FLOWS)
    t = R.load_truth(_flow_truth() if truth is None else truth)
    return {(g.query_id, g.span_s): g for g in R.summarize(R.join(loaded.rows, t.truth, t.epoch_ids),
                                                            loaded.own_span)}


def test_flows_are_scored_by_span_against_the_sum_of_their_epochs_truth() -> None:
    g = _flow_groups()
    assert sorted(g) == [("h", 600), ("u", 30), ("u", 300)]
    u = g[("u", 300)]
    assert (u.kind, u.cells, u.with_truth, u.without_truth, u.withheld) == ("rollup", 4, 3, 1, 0)
    assert u.coverage == {0.95: pytest.approx(2 / 3), 0.99: 1.0}
    assert u.mae == pytest.approx(23 / 3) and u.bias == pytest.approx(17 / 3)
    assert u.left_out == {R.NO_READING: 1}  # B's second span: epoch 13 has no reading, so no truth
    bins = {b.bin: b for b in u.by_bin}
    assert list(bins) == ["[10,50)", "[50,200)"]  # truths 30 and 10, then 50
    assert (bins["[10,50)"].cells, bins["[10,50)"].coverage, bins["[10,50)"].mae, bins["[10,50)"].bias) == \
        (2, {0.95: 1.0, 0.99: 1.0}, 1.5, -1.5)
    assert (bins["[50,200)"].cells, bins["[50,200)"].coverage, bins["[50,200)"].mae) == (1, {0.95: 0.0, 0.99: 1.0}, 20)
    h = g[("h", 600)]
    assert (h.kind, h.cells, h.with_truth, h.withheld, h.mae) == ("span", 2, 1, 1, 20.0)
    assert h.coverage == {0.95: 0.0, 0.99: 1.0}  # truth 30 + 50 = 80: below 85, on the 99% bound's edge
    assert h.left_out == {"withheld: too_few_participants": 1} and h.withheld_reasons == {"too_few_participants": 1}
    e = g[("u", 30)]
    assert (e.kind, e.with_truth, e.mae) == ("epoch", 1, 4.0)


def test_a_span_whose_epoch_lacks_truth_is_not_scored_against_zero() -> None:
    """Missing is not zero: B has no reading in epoch 13, so its span 10-19 has no truth. Summed
    as 0 its truth would be 9, inside the row's bounds [0, 30], and it would be scored."""
    loaded = R.load_estimates(FLOWS, R.Selection(stations=frozenset({B}), queries=frozenset({"u"}),
                                                 spans=frozenset({300})))
    t = R.load_truth(_flow_truth())
    cells = {c.row.epoch - E0: c for c in R.join(loaded.rows, t.truth, t.epoch_ids)}
    assert (cells[0].truth, cells[0].missing) == (10, None)
    assert (cells[10].truth, cells[10].missing) == (None, R.NO_READING)
    (g,) = R.summarize(cells.values())
    assert (g.with_truth, g.mae, g.coverage[0.95]) == (1, 1.0, 1.0)
    # the truth of epochs 15-19 not read (a run stopped): no truth either, and it says which
    cut = R.load_truth(_flow_truth()[:15])
    (c10,) = [c for c in R.join(loaded.rows, cut.truth, cut.epoch_ids) if c.row.epoch == E0 + 10]
    assert (c10.truth, c10.missing) == (None, R.NO_TRUTH_RECORD)
    # the series drawn has a gap there, not a 0
    s = R.series_for(list(cells.values()), "u", B, "rr", span_s=300)
    assert s is not None and s.truth[0] == 10.0 and math.isnan(s.truth[1]) and s.no_truth == 1


def test_every_row_left_out_is_named_with_its_reason() -> None:
    loaded = R.load_estimates([*FLOWS, b"garbage", FLOWS[0]], R.Selection(queries=frozenset({"u"})))
    assert loaded.not_selected == {"--query u": 2} and loaded.duplicates == 1 and loaded.invalid == 1
    t = R.load_truth(_flow_truth())
    groups = R.summarize(R.join(loaded.rows, t.truth, t.epoch_ids), loaded.own_span)
    text = R.format_summary(groups, loaded, t)
    assert "2 not selected (2 by --query u)" in text and "filtered out" not in text
    assert "kept by span: 30 s 1, 5 min 4" in text
    assert f"not scored               1 {R.NO_READING}" in text
    doc = R.summary_json(groups, loaded, t)
    assert doc["estimates"]["not_selected"] == {"--query u": 2}
    flow = next(x for x in doc["groups"] if x["span_s"] == 300)
    assert flow["left_out"] == {R.NO_READING: 1} and flow["kind"] == "rollup"
    assert flow["cells"] == flow["with_truth"] + sum(flow["left_out"].values())
    assert flow["coverage_by_truth_bin"][0] == {"bin": "[10,50)", "cells": 2, "coverage": {"0.95": 1.0, "0.99": 1.0},
                                                "mae": 1.5, "bias": -1.5}
    # the flows table, before the groups' blocks: one line per (query, span, estimator), with what it is good for
    lines = text.splitlines()
    start = lines.index(next(x for x in lines if x.startswith("flows by span"))) + 2
    (line,) = [x.split("  5-minute")[0].split() for x in lines[start:lines.index("", start)]]
    assert line == ["u", "5", "min", "rollup", "rr", "3/4", "7.7", "+5.7", "66.7%", "100.0%"]
    assert start < lines.index(next(x for x in lines if x.startswith("u / rr")))
    assert "    [50,200)     cells       1   95%   0.0%   99% 100.0%   MAE 20.0   bias +20.0" in text
    all_groups = _flow_groups()
    assert "withheld: too_few_participants" in R.format_summary(list(all_groups.values()))


def test_flow_plots_one_per_query_and_span_with_a_panel_per_station(tmp_path: Path) -> None:
    loaded = R.load_estimates(FLOWS)
    t = R.load_truth(_flow_truth())
    cells = R.join(loaded.rows, t.truth, t.epoch_ids)
    written = R.write_flow_plots(cells, tmp_path, [A, B], own_span=loaded.own_span)
    assert [p.name for p in written] == ["h_flows_600s_rr.png", "u_flows_300s_rr.png"]
    heights = {p.name: mpimg.imread(p).shape[:2] for p in written}
    assert heights["u_flows_300s_rr.png"] == (R.FLOW_HEAD_PX + 2 * R.FLOW_PANEL_PX, R.FIG_WIDTH_PX)
    assert heights["h_flows_600s_rr.png"] == (R.FLOW_HEAD_PX + R.FLOW_PANEL_PX, R.FIG_WIDTH_PX)  # B withheld only
    assert [p.name for p in R.write_plots(cells, tmp_path / "epochs", [A, B])] == [f"u_{A}_rr.png"]  # no flow there
    assert R.write_flow_plots([c for c in cells if c.row.span_s == 30], tmp_path / "none", [A]) == []


def test_no_source_data_cells_are_counted_apart_never_scored_against_a_placeholder_truth() -> None:
    """A dead detector's cells (data_quality no_source_data) are neither compared with the
    truth nor "without ground truth", even when the truth file gives them a flow: a truth
    record without ``no_truth`` (an older replay, another producer) says 0 for a dead station,
    and scoring that 0 would file a dead road's noise under quiet roads."""
    dead = [_est(e, B, est, (0, 6), (0, 9)).model_copy(update={"data_quality": "no_source_data"})
            for e, est in ((0, 40.0), (1, -3.0))]
    live = [_est(0, A, 10.0, (8, 12), (6, 14)), _est(1, A, 20.0, (18, 22), (15, 25))]
    truth = R.load_truth(_lines([_truth(0, {A: 11, B: 0}), _truth(1, {A: 30, B: 0})]))
    loaded = R.load_estimates(_lines([*live, *dead]))
    (g,) = R.summarize(R.join(loaded.rows, truth.truth))
    assert (g.cells, g.no_source_data, g.without_truth, g.with_truth) == (4, 2, 0, 2)
    assert g.coverage == {0.95: 0.5, 0.99: 0.5} and g.mae == 5.5  # A only: 11 in [8, 12], 30 outside
    text = R.format_summary([g], loaded, truth)
    assert "no source data           2" in text
    assert R.summary_json([g])["groups"][0]["no_source_data"] == 2


def test_the_summary_says_which_truth_epochs_have_no_estimate_and_why() -> None:
    """After a Ctrl-C the replay has sent the truth of epochs the worker had not closed yet:
    the summary names them (the last ones) instead of leaving 'ground truth: N epochs' unexplained."""
    loaded = R.load_estimates(_lines([_est(e, A, 10.0, (8, 12)) for e in (1, 2)]))
    truth = R.load_truth(_lines([_truth(e, {A: 10}) for e in range(6)]))
    assert truth.epoch_ids == frozenset(range(E0, E0 + 6))
    text = R.format_summary(R.summarize(R.join(loaded.rows, truth.truth)), loaded, truth)
    assert ("the last 3 of them (2026-11-18T08:01:30-08:00 .. 2026-11-18T08:02:30-08:00) have no estimate: "
            "the worker had not closed them") in text
    assert "1 earlier ones (2026-11-18T08:00:00-08:00) have no estimate: no query was active" in text
    complete = R.load_truth(_lines([_truth(e, {A: 10}) for e in (1, 2)]))
    assert "have no estimate" not in R.format_summary([], loaded, complete)


def test_help_says_95_and_99_percent_once_each(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse does not %-format a description: a doubled %% was printed as it is."""
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "95% and 99% bands" in out and "%%" not in out


def test_cli_reports_flows_by_span_and_filters_by_span(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    est = _write(tmp_path / "est.jsonl", FLOWS)
    truth = _write(tmp_path / "truth.jsonl", _flow_truth())
    out = tmp_path / "report"
    assert main(["report", "--estimates", str(est), "--truth", str(truth), "--out", str(out)]) == 0
    doc = json.loads((out / "summary.json").read_text())
    assert [(g["query_id"], g["span_s"], g["kind"]) for g in doc["groups"]] == [
        ("h", 600, "span"), ("u", 30, "epoch"), ("u", 300, "rollup")]
    assert sorted(doc["plots"]) == ["h_flows_600s_rr.png", f"u_{A}_rr.png", "u_flows_300s_rr.png"]
    assert "flows by span" in capsys.readouterr().out
    only = tmp_path / "hourly"
    assert main(["report", "--estimates", str(est), "--truth", str(truth), "--span", "300", "--out", str(only)]) == 0
    doc = json.loads((only / "summary.json").read_text())
    assert [g["span_s"] for g in doc["groups"]] == [300]
    assert doc["estimates"]["not_selected"] == {"--span 300": 3}
    with pytest.raises(SystemExit) as exc:
        main(["report", "--estimates", str(est), "--no-truth", "--span", "45"])
    assert exc.value.code == 2 and "multiple of 30" in capsys.readouterr().err


def test_withheld_codes_of_the_workers_own_rollup_reasons() -> None:
    """A rollup's reason as the worker writes it (``RollupState.reason``) gives the code of its
    first withheld epoch, with one or several epochs withheld (the epochs' own texts are checked
    against their codes in tests/unit/stream_app/worker/test_estimate.py)."""
    import numpy as np

    from stream_app.worker.records import EpochSummary
    from stream_app.worker.rollups import RollupPolicy

    def summary(epoch: int, code: str | None, why: str | None) -> EpochSummary:
        a = np.array([[1.0, 2.0]])
        return EpochSummary("q", 1, epoch, "markers", code, why, False, 40, 40, (40,), 0, 0, 0, None, (), ("rr",),
                            a, a * 0 + 4.0)

    for second, code in (((None, None), "missing_batches"), (("interrupted", "epoch interrupted: x"),
                                                             "missing_batches")):
        policy = RollupPolicy(spans=(2,))
        out = policy.apply(lambda rid: None, [summary(10, "missing_batches", "2 batch(es) the markers announce never "
                                                                                "arrived (reports [3] of [5])")])
        out = policy.apply(dict(out.touched).get, [summary(11, *second)])
        (st,) = out.decided
        reason = st.reason()
        assert reason is not None and reason.startswith("epoch ") and R.withheld_code(reason) == code, reason


def test_sampling_privacy_groups_carry_the_caveat_and_the_summary_says_once_what_a_day_figure_means() -> None:
    groups = _groups()
    text = R.format_summary(list(groups.values()))
    sp_block = text.split("\n\n")[1]
    rr_block = next(b for b in text.split("\n\n") if b.startswith("r / rr"))
    assert sp_block.startswith("q / sp_difference") and E.SP_CAVEAT in sp_block
    assert E.SP_CAVEAT not in rr_block and text.count(E.SP_CAVEAT) == 1
    assert text.count(E.plain_words()) == 1
    assert R.sp_caveat("sp") == R.sp_caveat("sp-binary") == E.SP_CAVEAT
    assert R.sp_caveat("alp") is None and R.sp_caveat("fresh") is None
