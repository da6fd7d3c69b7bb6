"""The sign of life of a long computation (stream_app/cli/working.py): on a terminal after a
quiet spell, a line rewritten and cleared; never under --json or without a terminal."""

from __future__ import annotations

import io
import json
import threading

import pytest

from stream_app.cli import main
from stream_app.cli.working import Working


def test_a_quick_computation_prints_nothing_and_a_slow_one_says_what_and_clears_its_line() -> None:
    quick = io.StringIO()
    with Working("planning", quick, enabled=True, quiet_s=10.0):
        pass
    assert quick.getvalue() == ""
    slow = io.StringIO()
    with Working("planning alp", slow, enabled=True, quiet_s=0.0, every_s=0.01) as w:
        w.wait_ticks(3)
    text = slow.getvalue()
    assert text.startswith("\rplanning alp: ") and text.count("\r") >= 4 and text.endswith("\r\x1b[K")


def test_not_a_terminal_means_no_line() -> None:
    out = io.StringIO()  # isatty() is False
    with Working("planning", out, quiet_s=0.0, every_s=0.01):
        threading.Event().wait(0.05)
    assert out.getvalue() == ""


def test_plan_json_stays_machine_readable(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stream_app.cli.working.QUIET_S", 0.0)
    assert main(["plan", "rr", "--population", "1000", "--expected-yes", "10", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert "planning" not in captured.err
