"""The report's section on what a day cap dropped (``stream_app.report.cap_drops``, read from the
replay's ``--cap-drops-file``): after the flows' blocks, apart from them, one line per capped
query with its dropped passages beside its flows' bias; in summary.json per query; "no passage"
from a file without a drop; absent without a file. A bad file is refused with its line. Reuses
test_flows_first's hand-made hour."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_app import report as R
from stream_app.report.cap_drops import CAP_DROPS_HEADER, CapDropError, read_cap_drops

from .test_flows_first import E0, A, B, _groups


def test_the_summary_says_what_the_cap_dropped_after_the_flows_beside_their_bias() -> None:
    loaded, truth, groups = _groups()
    drops = read_cap_drops(f"{CAP_DROPS_HEADER}\nhour,{E0},x,{A},30\nhour,{E0},x,{B},6\n")
    lines = R.format_summary(groups, loaded, truth, cap_drops=drops).splitlines()
    at = lines.index(next(x for x in lines if x.startswith("what the day cap dropped")))
    assert at > max(i for i, x in enumerate(lines) if x.startswith("hour / unary"))  # after the flows, apart
    assert lines[at + 1] == ("  hour: 36 passages in 2 of its 2 station-spans, 18.0 a station-span on average "
                             "(its flows' bias: +0.00)")  # the hand-made estimates are the truth: no bias
    doc = R.summary_json(groups, loaded, truth, cap_drops=drops)
    assert doc["cap_drops"] == {"hour": {"passages": 36, "station_spans": 2}}
    assert R.summary_json(groups, loaded, truth)["cap_drops"] is None
    assert not any(x.startswith("what the day cap") for x in R.format_summary(groups, loaded, truth).splitlines())
    nothing = read_cap_drops(CAP_DROPS_HEADER + "\n")  # a file, and no drop in it
    assert "what the day cap dropped: no passage" in R.format_summary(groups, loaded, truth, cap_drops=nothing)
    assert R.summary_json(groups, loaded, truth, cap_drops=nothing)["cap_drops"] == {}


@pytest.mark.parametrize("text", ["", "query_id,dropped\n", f"{CAP_DROPS_HEADER}\nhour,1,x,2\n",
                                  f"{CAP_DROPS_HEADER}\nhour,1,x,2,0\n",
                                  f"{CAP_DROPS_HEADER}\nhour,1,x,2,3\nhour,1,x,2,3\n",
                                  f"{CAP_DROPS_HEADER}\nhour,one,x,2,3\n"])
def test_a_file_that_is_not_a_cap_drops_file_is_refused_with_its_line(text: str) -> None:
    with pytest.raises(CapDropError, match=r"^line \d"):
        read_cap_drops(text)


def test_ptt_report_cap_drops_adds_the_section_and_a_bad_file_is_exit_5(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from stream_app.cli import main

    from .test_flows_first import _hour, _truth

    est, truth = tmp_path / "estimates.jsonl", tmp_path / "truth.jsonl"
    est.write_text("".join(e.model_dump_json() + "\n" for e in _hour()))
    truth.write_text("".join(t.model_dump_json() + "\n" for t in _truth()))
    drops = tmp_path / "cap-drops.csv"
    drops.write_text(f"{CAP_DROPS_HEADER}\nhour,{E0},x,{A},30\n")
    argv = ["report", "--estimates", str(est), "--truth", str(truth), "--no-plots", "--out", str(tmp_path / "r")]
    assert main([*argv, "--cap-drops", str(drops)]) == 0
    assert "  hour: 30 passages in 1 of its 2 station-spans" in (tmp_path / "r" / "summary.txt").read_text()
    capsys.readouterr()
    drops.write_text(f"{CAP_DROPS_HEADER}\nhour,{E0},x,{A},-1\n")
    assert main([*argv, "--cap-drops", str(drops)]) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{drops}: line 2:" in err[0] and "Traceback" not in err[0]
