"""The sign of life of a long computation (stream_app/cli/working.py): on a terminal after a
quiet spell, a line rewritten and cleared; never under --json or without a terminal."""

from __future__ import annotations

import io
import json
from typing import Any

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
    with Working("planning", out, quiet_s=0.0, every_s=0.01) as w:
        assert not w.enabled  # no line is started at all (nothing to wait for)
    assert out.getvalue() == ""


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["plan", "rr", "--population", "1000", "--expected-yes", "10"],
                                  ["plan", "fleet", "--population", "899", "--expected-yes", "10", "--stations", "16"]],
                         ids=["plan", "plan fleet"])
def test_plan_json_stays_machine_readable(argv: list[str], capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Under --json the sign of life is off whatever stderr is; without it, it follows the
    terminal (``enabled`` None). Fails with the --json guard removed from either command."""
    import stream_app.cli.working as working

    asked: list[bool | None] = []

    class Recording(working.Working):
        def __init__(self, what: str, stream: Any = None, enabled: bool | None = None, **kw: Any) -> None:
            asked.append(enabled)
            super().__init__(what, stream, enabled, **kw)

    monkeypatch.setattr(working, "Working", Recording)
    assert main([*argv, "--json"]) == 0
    json.loads(capsys.readouterr().out)
    assert asked == [False]
    assert main(argv) == 0
    assert asked == [False, None]
