"""``ptt demo``'s ``run.log``: every line the demo prints also goes to a file in its output
directory, once -- also after ``make run | tee run.log`` and a Ctrl-C closed stdout's pipe (the
lines that then go to stderr are not copied twice) -- and a terminal's progress redraws stay
off it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from stream_app.cli.demo_output import output_may_close


def test_every_line_goes_to_the_file_once_also_after_the_pipe_closed(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    fr, fw = os.pipe()
    log = tmp_path / "out" / "run.log"  # its directory is made at the first line
    with os.fdopen(w, "w") as stdout, os.fdopen(fw, "w") as stderr:
        monkeypatch.setattr(sys, "stdout", stdout)
        monkeypatch.setattr(sys, "stderr", stderr)
        with output_may_close(copy=log):
            print("replaying the synthetic day", flush=True)
            print("\repoch 3/10 (30%)", end="", file=sys.stderr, flush=True)  # a terminal's redraw
            print("epoch 10/10 (100%)", file=sys.stderr, flush=True)
            assert os.read(r, 100) == b"replaying the synthetic day\n"
            os.close(r)  # tee is gone (Ctrl-C)
            print("saved 12 estimates", flush=True)
            print("report      summary.txt", flush=True)
        assert (sys.stdout, sys.stderr) == (stdout, stderr)
    assert log.read_text() == ("replaying the synthetic day\nepoch 10/10 (100%)\nsaved 12 estimates\n"
                               "report      summary.txt\n")
    assert b"saved 12 estimates\nreport      summary.txt\n" in os.read(fr, 1000)  # the terminal has them too
    os.close(fr)


def test_a_file_that_cannot_be_written_costs_no_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    with output_may_close(copy=tmp_path / "file" / "run.log"):  # its directory is a file
        print("saved 12 estimates", flush=True)
    assert capsys.readouterr().out == "saved 12 estimates\n"
