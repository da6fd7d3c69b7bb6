"""A newcomer never sees a traceback: every expected failure of every command is one line
``ptt <cmd>: error: <what>; <fix>`` with its own exit code, found before the network is
touched; anything unexpected goes to a log file. No broker runs here: "unreachable" is a
loopback port nobody listens on."""

from __future__ import annotations

import argparse
import logging
import sys
import time
import typing
from datetime import date
from pathlib import Path

import pytest

from stream_app import cli
from stream_app.cli import build_parser, errors, main, synth
from stream_app.cli.local_broker import free_port
from tests.paths import ROOT


@pytest.fixture
def dead_port() -> int:
    return free_port()  # nothing listens there: connections are refused


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    return code, err


def _one_line(err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ptt {command}: error: "), err
    assert "Traceback" not in err and "http" not in err and "errors.pydantic.dev" not in err
    return lines[0]


def test_every_option_of_every_command_has_help() -> None:
    missing = []
    for leaf in cli._leaves(build_parser()):
        for action in leaf._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{leaf.prog} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"options without help text: {missing}"


def test_exit_codes_are_distinct_and_documented() -> None:
    codes = [errors.EXIT_OK, errors.EXIT_FAILURE, errors.EXIT_USAGE, errors.EXIT_BROKER, errors.EXIT_PORT,
             errors.EXIT_INPUT, errors.EXIT_EMPTY, errors.EXIT_BROKER_LOST, errors.EXIT_HELPER, errors.EXIT_UNPUBLISHED,
             errors.EXIT_INTERRUPTED]
    assert len(set(codes)) == len(codes) == len(errors.EXIT_CODES)
    readme = (ROOT / "README.md").read_text()
    for code in codes:
        assert f"| {code} |" in readme, f"exit code {code} is not in the README's table"


@pytest.mark.parametrize(("argv", "command", "flag"), [
    (["demo", "--speed", "-1"], "demo", "--speed"),
    (["replay", "--speed", "-3"], "replay", "--speed"),
    (["demo", "--stations", "0"], "demo", "--stations"),
    (["replay", "--producers", "0"], "replay", "--producers"),
    (["worker", "--web-port", "70000"], "worker", "--web-port"),
])
def test_bad_values_are_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str], argv: list[str], command: str,
                                                  flag: str) -> None:
    code, err = _run(capsys, *argv)
    assert code == errors.EXIT_USAGE
    assert flag in _one_line(err, command)


def test_bad_time_is_rejected_by_the_parser(capsys: pytest.CaptureFixture[str], dead_port: int) -> None:
    code, err = _run(capsys, "analyst", "publish", "q", "--analyst", "a", "--mechanism", "sp", "--sensors", "1",
                     "--population", "5", "--t-start", "yesterday", "--t-end", "2026-11-18T06:00:00-08:00",
                     "--bootstrap-servers", f"127.0.0.1:{dead_port}")
    assert code == errors.EXIT_USAGE
    assert "--t-start" in _one_line(err, "analyst publish")


def test_publish_validates_the_query_before_the_network(capsys: pytest.CaptureFixture[str], dead_port: int) -> None:
    """An invalid query is a usage error (2) even though the broker is unreachable (3)."""
    code, err = _run(capsys, "analyst", "publish", "q", "--analyst", "a", "--mechanism", "alp", "--sensors", "1",
                     "--population", "10", "--t-start", "2026-11-18T06:00:00-08:00",
                     "--t-end", "2026-11-18T05:00:00-08:00", "--bootstrap-servers", f"127.0.0.1:{dead_port}")
    assert code == errors.EXIT_USAGE
    assert "t_end must be after" in _one_line(err, "analyst publish")


@pytest.mark.parametrize("argv", [["analyst", "list"], ["subscribe"], ["replay", "--max-epochs", "1"],
                                  ["worker", "--web-port", "0"]])
def test_refused_broker_fails_at_once(capsys: pytest.CaptureFixture[str], tmp_path: Path, dead_port: int,
                                      argv: list[str]) -> None:
    """Default timeouts and attempts: a refused connection is not retried for 36-52 s."""
    extra = ["--data-dir", str(tmp_path)] if argv[0] == "replay" else []
    if argv[0] == "worker":
        argv = ["worker", "--web-port", str(free_port())]
    t0 = time.monotonic()
    code, err = _run(capsys, *argv, *extra, "--bootstrap-servers", f"127.0.0.1:{dead_port}")
    elapsed = time.monotonic() - t0
    assert code == errors.EXIT_BROKER, err
    line = _one_line(err, argv[0] if argv[0] != "analyst" else "analyst list")
    assert f"cannot reach the Kafka broker at 127.0.0.1:{dead_port}" in line and "ptt broker" in line
    assert elapsed < 10, f"took {elapsed:.1f}s"


def test_replay_reaches_the_broker_before_it_reads_the_day(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                           dead_port: int) -> None:
    """No broker: exit 3 before any data file is parsed or any synthetic day generated. Before,
    a 206 MB PeMS file was parsed for 17.8 s (a 500-station synthetic day generated for 15 s) to
    end in the same exit 3; here an unparseable file would be exit 5 and the 3,220-station day
    takes minutes to generate, so either order shows."""
    data = tmp_path / "d"
    broker = ["--bootstrap-servers", f"127.0.0.1:{dead_port}", "--data-dir", str(data)]
    bad = tmp_path / "bad.txt.gz"
    bad.write_bytes(b"\x1f\x8b" + b"not really gzip" * 10)
    for source in (["--pems-raw", str(bad)], ["--synthetic-stations", "3220"]):
        t0 = time.monotonic()
        code, err = _run(capsys, "replay", *source, *broker)
        elapsed = time.monotonic() - t0
        assert code == errors.EXIT_BROKER, err
        assert f"cannot reach the Kafka broker at 127.0.0.1:{dead_port}" in _one_line(err, "replay")
        assert elapsed < 5, f"took {elapsed:.1f}s"
        assert not data.exists() or not any(data.iterdir()), sorted(data.rglob("*"))  # nothing parsed or written


@pytest.fixture
def broker_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay's broker check passes (no broker runs here): what is read after it is tested."""
    from producers.replay import plan

    monkeypatch.setattr(plan, "check_broker", lambda settings: None)


def test_missing_unreadable_and_empty_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             dead_port: int, broker_answers: None) -> None:
    """A missing file fails before anything else; a file that cannot be read as a day fails
    once the broker has answered (:func:`test_replay_reaches_the_broker_before_it_reads_the_day`)."""
    broker = ["--bootstrap-servers", f"127.0.0.1:{dead_port}", "--data-dir", str(tmp_path / "d")]
    code, err = _run(capsys, "replay", "--pems-raw", str(tmp_path / "nope.txt.gz"), *broker)
    assert code == errors.EXIT_INPUT and "nope.txt.gz" in _one_line(err, "replay")
    bad = tmp_path / "bad.txt.gz"
    bad.write_bytes(b"\x1f\x8b" + b"not really gzip" * 10)
    code, err = _run(capsys, "replay", "--pems-raw", str(bad), *broker)
    assert code == errors.EXIT_INPUT and "unreadable gzip" in _one_line(err, "replay")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    code, err = _run(capsys, "replay", "--pems-raw", str(empty), *broker)
    assert code == errors.EXIT_EMPTY and "no usable rows" in _one_line(err, "replay")
    code, err = _run(capsys, "demo", "--pems-raw", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "out"))
    assert code == errors.EXIT_INPUT and "nope.txt" in _one_line(err, "demo")


def test_day_selects_a_day_of_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, dead_port: int,
                                       broker_answers: None) -> None:
    """--day reaches the readers: a day the file does not hold is empty data (before any topic)."""
    from producers.replay import load_day
    from producers.settings import ReplaySettings

    s = ReplaySettings(data_dir=tmp_path, synthetic_stations=2, day=date(2026, 11, 18))
    assert load_day(s).epochs.size == 2880
    code, err = _run(capsys, "replay", "--day", "2026-11-19", "--synthetic-stations", "2", "--data-dir",
                     str(tmp_path), "--bootstrap-servers", f"127.0.0.1:{dead_port}")
    assert code == errors.EXIT_EMPTY and "2026-11-19" in _one_line(err, "replay")


def test_ports_in_use(capsys: pytest.CaptureFixture[str], held_port: int, dead_port: int) -> None:
    code, err = _run(capsys, "broker", "--port", str(held_port))
    assert code == errors.EXIT_PORT and str(held_port) in _one_line(err, "broker")
    code, err = _run(capsys, "worker", "--web-port", str(held_port), "--bootstrap-servers", f"127.0.0.1:{dead_port}")
    assert code == errors.EXIT_PORT and str(held_port) in _one_line(err, "worker")
    code, err = _run(capsys, "demo", "--metrics-port", str(held_port), "--out", "/nonexistent/never-created")
    assert code == errors.EXIT_PORT and str(held_port) in _one_line(err, "demo")


def test_unexpected_failure_is_one_line_and_a_kept_log(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(args: argparse.Namespace) -> int:
        raise RuntimeError("something nobody expected")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(synth, "run", boom)
    code, err = _run(capsys, "synth", str(tmp_path / "day"))
    assert code == errors.EXIT_FAILURE
    line = _one_line(err, "synth")
    log = tmp_path / errors.ERROR_LOG
    assert str(log) in line
    text = log.read_text()
    assert "Traceback" in text and "something nobody expected" in text


def test_the_error_log_keeps_no_secret(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The log of an unexpected failure (in the working directory, or the system's temporary
    directory when that is not writable) has the command line without its secrets' values;
    SECRET_FLAGS are the flags of every SecretStr setting."""
    from pydantic import SecretStr

    from producers.settings import ReplaySettings
    from stream_app.cli import replay
    from stream_app.shuffler.settings import ShufflerSettings

    secret_fields = {f"--{name.replace('_', '-')}" for model in (ReplaySettings, ShufflerSettings)
                     for name, info in model.model_fields.items() if SecretStr in typing.get_args(info.annotation)}
    assert secret_fields == set(errors.SECRET_FLAGS)

    def boom(args: argparse.Namespace) -> int:
        raise RuntimeError("something nobody expected")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(replay, "run", boom)
    argv = ["replay", "--enrollment-secret", "operator-secret-0123456789abcdef0123456789",
            "--sasl-plain-pass=hunter2-hunter2", "--ssl-password", "pem-passphrase-xyz"]
    monkeypatch.setattr(sys, "argv", ["ptt", *argv])
    code, err = _run(capsys, *argv)
    assert code == errors.EXIT_FAILURE, err
    text = (tmp_path / errors.ERROR_LOG).read_text()
    assert "something nobody expected" in text and "--enrollment-secret ***" in text, text
    assert not any(v in text for v in ("operator-secret", "hunter2", "pem-passphrase")), text


def test_kafka_client_noise_is_silenced_unless_verbose(capsys: pytest.CaptureFixture[str], dead_port: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PTT_LOG_LEVEL", raising=False)
    kafka_logger = logging.getLogger("kafka")
    monkeypatch.setattr(kafka_logger, "level", logging.NOTSET)
    _run(capsys, "analyst", "list", "--bootstrap-servers", f"127.0.0.1:{dead_port}")
    assert kafka_logger.level == logging.CRITICAL
    kafka_logger.setLevel(logging.NOTSET)
    _run(capsys, "analyst", "list", "--verbose", "--bootstrap-servers", f"127.0.0.1:{dead_port}")
    assert kafka_logger.level == logging.NOTSET


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, "demo", "--speed", "fast")
    assert code == errors.EXIT_USAGE
    _one_line(err, "demo")
    assert "--help" in err


def test_subscribe_to_a_file_checks_its_directory_and_flags_before_the_network(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, dead_port: int) -> None:
    broker = ["--bootstrap-servers", f"127.0.0.1:{dead_port}"]
    code, err = _run(capsys, "subscribe", "--parquet", str(tmp_path / "nope" / "day.parquet"), *broker)
    assert code == errors.EXIT_USAGE and "nope is not a directory" in _one_line(err, "subscribe")
    code, err = _run(capsys, "subscribe", "--json", "--arrow", str(tmp_path / "day.arrow"), *broker)
    assert code == errors.EXIT_USAGE and "not allowed with argument" in _one_line(err, "subscribe")
    code, err = _run(capsys, "subscribe", "--arrow", str(tmp_path / "day.arrow"), *broker)
    assert code == errors.EXIT_BROKER and not (tmp_path / "day.arrow").exists()  # connects before writing


def test_a_missing_or_short_enrollment_secret_is_one_line_before_the_network(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, dead_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shuffler and a replay through it need the enrollment secret (docs/wire.md, "Device
    authentication"): none, an unreadable file or a short one is one line and exit 2, before any
    connection (a dead broker would be exit 3); so is a replay fleet beyond the enrolled devices,
    found once the broker answered and the day is read (before any topic is created)."""
    monkeypatch.delenv("PTT_ENROLLMENT_SECRET", raising=False)
    broker = ["--bootstrap-servers", f"127.0.0.1:{dead_port}"]
    short = tmp_path / "short"
    short.write_text("too short\n")
    for extra, what in (([], "no enrollment secret"), (["--enrollment-secret-file", str(tmp_path / "nope")],
                                                       "cannot read the enrollment secret file"),
                        (["--enrollment-secret-file", str(short)], "at least 32")):
        code, err = _run(capsys, "shuffler", "--metrics-port", "0", *broker, *extra)
        assert code == errors.EXIT_USAGE and what in _one_line(err, "shuffler"), err
        code, err = _run(capsys, "replay", "--via-shuffler", "--data-dir", str(tmp_path / "d"), *broker, *extra)
        assert code == errors.EXIT_USAGE and what in _one_line(err, "replay"), err
    monkeypatch.setenv("PTT_ENROLLMENT_SECRET", "s" * 40)
    from producers.replay import plan

    monkeypatch.setattr(plan, "check_broker", lambda settings: None)
    code, err = _run(capsys, "replay", "--via-shuffler", "--data-dir", str(tmp_path / "d"), "--synthetic-stations",
                     "2", "--enrolled-devices", "3", *broker)
    assert code == errors.EXIT_USAGE and "enrolled devices" in _one_line(err, "replay"), err
