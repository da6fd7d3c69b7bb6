"""The replay's settings: which mechanisms the default queries run (producers/settings.py)."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from estimators import default_query_mechanisms
from producers.settings import ReplaySettings
from stream_app.cli import main


def test_the_default_queries_are_the_registrys_and_sampling_privacy_is_opt_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PTT_QUERY_MECHANISMS", raising=False)
    assert ReplaySettings().mechanisms == default_query_mechanisms() == ("alp", "unary")
    assert ReplaySettings(query_mechanisms=" sp , alp,unary").mechanisms == ("sp", "alp", "unary")
    monkeypatch.setenv("PTT_QUERY_MECHANISMS", "sp,unary")
    assert ReplaySettings().mechanisms == ("sp", "unary")


@pytest.mark.parametrize(("value", "why"), [("sp,nope", "unknown query mechanism 'nope'"),
                                            (" , ", "name at least one"), ("alp,alp", "named twice")])
def test_a_bad_mechanism_list_is_refused(value: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        ReplaySettings(query_mechanisms=value)


@pytest.mark.parametrize("command", ["replay", "demo"])
def test_the_flag_is_checked_before_the_network(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A broker address that would hang (a blackhole) is never tried: exit 2 at once, one line."""
    argv = [command, "--query-mechanisms", "sp,nope"]
    if command == "replay":
        argv += ["--bootstrap-servers", "10.255.255.1:9"]
    started = time.monotonic()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "unknown query mechanism 'nope'" in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert time.monotonic() - started < 10
