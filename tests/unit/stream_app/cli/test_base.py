"""Configuration: PTT_* environment variables and flags; flags win; secrets stay secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.settings import ReplaySettings
from schemas.settings import KafkaSettings
from stream_app.cli import build_parser
from stream_app.cli.base import settings_from_args
from tests.paths import ROOT


def _replay(argv: list[str]) -> ReplaySettings:
    args = build_parser().parse_args(["replay", *argv])
    return settings_from_args(ReplaySettings, args)


def test_env_is_read_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTT_SEED", "5")
    monkeypatch.setenv("PTT_TRUTH", "0")  # "0" must be False (faust's bool(os.getenv) mistake)
    monkeypatch.setenv("PTT_MODE", "tally")
    monkeypatch.setenv("PTT_DEVICE_BLACKLIST", "[400001, 400002]")
    s = _replay([])
    assert (s.seed, s.truth, s.mode, s.device_blacklist) == (5, False, "tally", (400001, 400002))
    s = _replay(["--seed", "9", "--truth", "--mode", "per-vehicle", "--device-blacklist", "7,8"])
    assert (s.seed, s.truth, s.mode, s.device_blacklist) == (9, True, "per-vehicle", (7, 8))


def test_data_and_worker_dirs_default_to_the_users_cache_not_the_working_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The replay's data (synthetic days, parsed days) and the worker's local files go to the
    user's cache directory (schemas.settings.cache_dir): $XDG_CACHE_HOME/ptt, else ~/.cache/ptt,
    read when the settings are made; a flag or PTT_* variable still wins."""
    from stream_app.settings import WorkerSettings

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _replay([]).data_dir == tmp_path / "xdg" / "ptt"
    assert WorkerSettings().worker_dir == tmp_path / "xdg" / "ptt" / "worker"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _replay([]).data_dir == tmp_path / "home" / ".cache" / "ptt"
    assert WorkerSettings().worker_dir == tmp_path / "home" / ".cache" / "ptt" / "worker"
    monkeypatch.setenv("PTT_DATA_DIR", str(tmp_path / "env"))
    assert _replay([]).data_dir == tmp_path / "env"
    assert _replay(["--data-dir", str(tmp_path / "flag")]).data_dir == tmp_path / "flag"


def test_codec_settings_from_env_flags_and_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """``topic_compression`` is JSON in the environment, name=codec on the command line (merged
    over the environment's entries), and a child process given ``to_env()`` gets the same settings."""
    monkeypatch.setenv("PTT_TOPIC_COMPRESSION", '{"ptt.estimate-frames": "zstd"}')
    monkeypatch.setenv("PTT_COMPRESSION_TYPE", "none")
    s = _replay([])
    assert (s.compression_type, s.topic_compression) == ("none", {"ptt.estimate-frames": "zstd"})
    s = _replay(["--compression-type", "lz4", "--topic-compression", "ptt.reports=gzip, t2=zstd"])
    # the flag's entries are merged over the environment's (pydantic-settings' deep update)
    assert (s.compression_type, s.topic_compression) == (
        "lz4", {"ptt.estimate-frames": "zstd", "ptt.reports": "gzip", "t2": "zstd"})
    monkeypatch.delenv("PTT_TOPIC_COMPRESSION")
    monkeypatch.delenv("PTT_COMPRESSION_TYPE")
    for name, value in s.to_env().items():
        monkeypatch.setenv(name, value)
    assert ReplaySettings() == s
    with pytest.raises(ValueError, match="topic_compression"):
        _replay(["--topic-compression", "ptt.reports=brotli"])
    with pytest.raises(SystemExit):
        _replay(["--topic-compression", "ptt.reports"])


def test_invalid_values_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="speed"):
        _replay(["--speed", "-1"])
    with pytest.raises(ValueError, match="not both"):
        _replay(["--pems-raw", "a.txt", "--pems-5min", "b.txt"])
    monkeypatch.setenv("PTT_PRODUCERS", "0")
    with pytest.raises(ValueError, match="producers"):
        _replay([])


def test_security_options_pass_through_and_stay_secret() -> None:
    s = KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="u",
                      sasl_plain_password="hunter2", ssl_cafile="/etc/ca.pem")  # type: ignore[arg-type]
    kw = s.client_kwargs()
    assert kw["security_protocol"] == "SASL_SSL" and kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kw["sasl_plain_password"] == "hunter2" and kw["ssl_cafile"] == "/etc/ca.pem"
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.model_dump())
    assert KafkaSettings().client_kwargs().keys() >= {"bootstrap_servers", "security_protocol"}
    assert "sasl_mechanism" not in KafkaSettings().client_kwargs()


def test_every_setting_has_a_flag() -> None:
    parser = build_parser()
    replay = parser._subparsers._group_actions[0].choices["replay"]  # type: ignore[union-attr]
    dests = {a.dest for a in replay._actions}
    assert set(ReplaySettings.model_fields) <= dests


def test_configuration_doc_lists_every_setting() -> None:
    """docs/configuration.md is generated from the settings classes and current."""
    import importlib.util

    from stream_app.cli.demo_settings import DemoSettings
    from stream_app.settings import WorkerSettings

    root = ROOT
    doc = (root / "docs" / "configuration.md").read_text()
    names = {f"PTT_{n.upper()}" for n in set(ReplaySettings.model_fields) | set(WorkerSettings.model_fields)}
    names |= {f"PTT_DEMO_{n.upper()}" for n in DemoSettings.model_fields}
    missing = [n for n in sorted(names) if f"`{n}`" not in doc]
    assert not missing, f"docs/configuration.md lacks {missing}"
    spec = importlib.util.spec_from_file_location("gen_configuration", root / "docs" / "gen_configuration.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert doc == gen.render(), "stale: python docs/gen_configuration.py > docs/configuration.md"
