"""`ptt analyst publish | update | list` against a real broker."""

from __future__ import annotations

import json

import pytest

from estimators import SP_CAVEAT, vehicle_day
from schemas.kafka_io import read_queries
from schemas.settings import KafkaSettings
from stream_app.cli import main
from stream_app.worker.estimate import ShuffledEpsilon

pytestmark = pytest.mark.integration


def _flags(s: KafkaSettings) -> list[str]:
    return ["--bootstrap-servers", s.bootstrap_servers, "--queries-topic", s.queries_topic]


def test_publish_update_list(kafka_settings: KafkaSettings, capsys: pytest.CaptureFixture[str]) -> None:
    f = _flags(kafka_settings)
    assert main(["analyst", "publish", "peak-rr", "--analyst", "ana", "--mechanism", "rr", "--sensors",
                 "400001,400002,400003", "--population", "5039", "--t-start", "2026-11-18T06:00:00-08:00",
                 "--t-end", "2026-11-18T10:00:00-08:00", "--param", "pi1=0.8", *f]) == 0
    assert "published peak-rr:v1" in capsys.readouterr().out
    assert main(["analyst", "update", "peak-rr", "--param", "pi1=0.7", "--t-start",
                 "2026-11-18T07:00:00-08:00", *f]) == 0
    assert "published peak-rr:v2" in capsys.readouterr().out
    assert main(["analyst", "list", "--json", *f]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(q["query_id"], q["version"], q["params"]["pi1"]) for q in listed] == [("peak-rr", 1, 0.8),
                                                                                   ("peak-rr", 2, 0.7)]
    assert listed[1]["sensors"] == [400001, 400002, 400003] and listed[1]["analyst_id"] == "ana"
    assert listed[1]["t_start"].startswith("2026-11-18T07:00:00")
    assert [q.version for q in read_queries(kafka_settings)] == [1, 2]
    fig = listed[1]["privacy"]  # local and the aggregate release's side by side, at the query's population
    assert fig["shuffle_trust"].startswith("assumes the shuffler does not collude")
    assert fig["release"] == "aggregate"
    assert 0 < fig["epsilon_shuffled"] < fig["epsilon"] and 0 < fig["epsilon_day_shuffled"] < fig["epsilon_day"]
    # the figure the worker publishes for an aggregate release of the whole population: the same n,
    # rounded down to 2 significant digits (5,039 -> 5,000), the same release and the same value
    assert (fig["shuffle_size"], fig["shuffle_size_asked"]) == (5000, 5039)
    query = read_queries(kafka_settings)[1]
    assert fig["epsilon_shuffled"] == ShuffledEpsilon(1e-6).get(query, 5039, "aggregate")
    assert fig["epsilon_shuffled"] != ShuffledEpsilon(1e-6).get(query, 5039, "permuted")
    day = vehicle_day([(query.spec, query.build(), query.n_stations)], 5000, "aggregate")
    assert fig["epsilon_day_shuffled"] == day["shuffled"]
    assert main(["analyst", "list", *f]) == 0
    out = capsys.readouterr().out
    assert ("peak-rr v2  rr  3 sensors" in out
            and f"aggregate release among n=5,000: {fig['epsilon_shuffled']:.4g}  by" in out)
    assert "the worker publishes epsilon_shuffled for the release its shuffler attests" in out
    assert "Each such figure assumes the shuffler does not collude with the analyst" in out
    # a vehicle's day across every query it answers (the newest version of each), through the release,
    # and once what it means
    assert (f"a vehicle's day across its 1 query (peak-rr): epsilon {day['shuffled']:.4g} at delta 1e-06 through "
            f"the shuffler's aggregate release among n=5,000 (local, without it: {day['local']:.4g})") in out
    assert out.count("What a vehicle's day figure epsilon means") == 1
    assert day["shuffled"] < day["local"]
    assert main(["analyst", "list", "--release", "permuted", *f]) == 0
    permuted = ShuffledEpsilon(1e-6).get(query, 5039, "permuted")
    assert f"permuted release among n=5,000: {permuted:.4g}  by" in capsys.readouterr().out
    assert main(["analyst", "list", "--release", "local", *f]) == 0
    assert f"peak-rr): epsilon {day['local']:.4g} at delta 1e-06, local (no shuffler)" in capsys.readouterr().out
    assert main(["analyst", "list", "--shuffled-day", *f]) == 0  # the day too, on request
    assert f"n=5,000: {fig['epsilon_shuffled']:.4g} (day {fig['epsilon_day_shuffled']:.4g})" in capsys.readouterr().out


def test_sampling_privacy_has_its_caveat_and_no_day(kafka_settings: KafkaSettings,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    f = _flags(kafka_settings)
    for qid, mech in (("sp-q", "sp"), ("alp-q", "alp")):
        assert main(["analyst", "publish", qid, "--analyst", "ana", "--mechanism", mech, "--sensors",
                     "400001,400002", "--population", "2000", "--t-start", "2026-11-18T06:00:00-08:00",
                     "--t-end", "2026-11-18T10:00:00-08:00", *f]) == 0
    capsys.readouterr()
    for release in ("aggregate", "local"):
        assert main(["analyst", "list", "--release", release, *f]) == 0
        out = capsys.readouterr().out
        assert out.count(SP_CAVEAT) == 1, out  # once, in the day's line
        assert "a vehicle's day across its 1 query (alp-q)" in out and "not counting sp-q" in out
        sp_line = next(line for line in out.splitlines() if line.startswith("sp-q v1"))
        assert "(day no bound)" in sp_line
        if release == "aggregate":
            assert "aggregate release among n=2,000: no bound" in sp_line


@pytest.mark.parametrize(("argv", "message"), [
    (["update", "nope", "--param", "pis=0.2"], "no query 'nope' to update"),
    (["publish", "q", "--analyst", "a", "--mechanism", "alp", "--sensors", "1", "--population", "10",
      "--t-start", "2026-11-18T06:00:00-08:00", "--t-end", "2026-11-18T05:00:00-08:00"], "t_end must be after"),
    (["publish", "q", "--analyst", "a", "--mechanism", "alp", "--sensors", "1", "--population", "10",
      "--t-start", "2026-11-18T06:00:00-08:00", "--t-end", "2026-11-18T07:00:00-08:00", "--param", "pisNo=3"],
     "pisNo must be a probability"),
])
def test_bad_requests(kafka_settings: KafkaSettings, capsys: pytest.CaptureFixture[str], argv: list[str],
                      message: str) -> None:
    assert main(["analyst", *argv, *_flags(kafka_settings)]) == 2
    assert message in capsys.readouterr().err


def test_versions_are_immutable(kafka_settings: KafkaSettings, capsys: pytest.CaptureFixture[str]) -> None:
    f = _flags(kafka_settings)
    args = ["analyst", "publish", "q1", "--analyst", "a", "--mechanism", "rr", "--sensors", "7", "--population",
            "100", "--t-start", "2026-11-18T06:00:00-08:00", "--t-end", "2026-11-18T07:00:00-08:00", *f]
    assert main(args) == 0
    assert main(args) == 2
    assert "versions are immutable" in capsys.readouterr().err


def test_unreachable_broker(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyst", "list", "--bootstrap-servers", "127.0.0.1:1", "--bootstrap-timeout-ms", "200",
                 "--connect-attempts", "1"]) == 3
    assert "cannot reach the Kafka broker" in capsys.readouterr().err
