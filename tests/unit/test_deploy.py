"""deploy/: the compose file, Dockerfile, topic script, Prometheus and Grafana configuration and
the dashboards agree with each other and with the code (settings, CLI, metrics). No network,
no Docker: everything is parsed, the topic script runs against a fake kafka-topics.sh, and
promtool checks the Prometheus configuration when it is installed."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

import estimators as E
from producers.settings import ReplaySettings
from stream_app.cli import build_parser
from stream_app.metrics import StreamMonitor
from stream_app.settings import WorkerSettings
from stream_app.settings_cli import settings_from_args

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
GRAFANA = DEPLOY / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
TOPICS_SCRIPT = DEPLOY / "kafka" / "create-topics.sh"

# Grafana's global variables that may appear in an expression without a templating entry
GRAFANA_GLOBALS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms"}
PROMQL_FUNCTIONS = {"sum", "max", "min", "avg", "count", "rate", "irate", "increase", "histogram_quantile",
                    "scalar", "vector", "topk", "bottomk", "abs", "clamp_min", "clamp_max", "delta", "deriv",
                    "absent", "time", "quantile", "max_over_time", "min_over_time", "count_over_time",
                    "sum_over_time", "label_replace"}
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                   "offset"}
TARGET_LABELS = {"instance", "job", "service"}  # added by Prometheus (service: relabelled in prometheus.yml)


# -- loading ---------------------------------------------------------------------------------

def _yaml(path: Path) -> Any:
    with path.open() as fh:
        return yaml.safe_load(fh)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = _yaml(COMPOSE)
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svc = compose["services"]
    assert isinstance(svc, dict)
    return svc


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    boards = {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}
    assert set(boards) == {"overview.json", "station.json"}
    return boards


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboards", GRAFANA / "build_dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows keep their panels inside


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of every volume of a service (short syntax)."""
    out = []
    for vol in service.get("volumes", []):
        assert isinstance(vol, str), f"use the short volume syntax: {vol!r}"
        source, target = vol.split(":")[:2]
        out.append((source, target))
    return out


def _settings_in_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("PTT_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def _worker_settings(services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> WorkerSettings:
    """What `ptt worker` in the worker container runs with: its command line and environment."""
    _settings_in_env(monkeypatch, _env(services["worker"]))
    args = build_parser().parse_args(services["worker"]["command"][1:])
    return settings_from_args(WorkerSettings, args)


def _replay_settings(services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> ReplaySettings:
    _settings_in_env(monkeypatch, _env(services["replay"]))
    args = build_parser().parse_args(services["replay"]["command"][1:])
    return settings_from_args(ReplaySettings, args)


# -- docker compose ----------------------------------------------------------------------------

def test_compose_services_have_an_image_or_a_build(compose: dict[str, Any],
                                                   services: dict[str, dict[str, Any]]) -> None:
    assert "version" not in compose  # the compose spec has no version
    assert {"kafka", "topics", "worker", "replay", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        assert svc.get("image") or svc.get("build"), f"{name}: neither image nor build"
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["topics"]["image"] == services["kafka"]["image"]
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    assert services["grafana"]["image"].startswith("grafana/grafana:")
    for name in ("worker", "replay"):  # the project image, built from deploy/Dockerfile
        assert services[name]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert services["worker"]["image"] == services["replay"]["image"]


def test_kafka_runs_in_kraft_mode_with_a_plaintext_listener_for_the_services(
        services: dict[str, dict[str, Any]]) -> None:
    env = _env(services["kafka"])
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{node}@kafka:9093"
    assert "CONTROLLER://:9093" in env["KAFKA_LISTENERS"].split(",")
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert protocols["PLAINTEXT"] == "PLAINTEXT" and protocols["CONTROLLER"] == "PLAINTEXT"
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", env["CLUSTER_ID"])  # a base64url UUID
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # topics come from the topics service
    assert services["kafka"]["healthcheck"]["test"]


def test_every_local_path_exists(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    named = set(compose.get("volumes") or {})
    for name, svc in services.items():
        build = svc.get("build")
        if build:
            context = (DEPLOY / build["context"]).resolve()
            assert context.is_dir(), f"{name}: build context {context}"
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), f"{name}: Dockerfile"
        for source, _ in _mounts(svc):
            if source.startswith((".", "/")):
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in named, f"{name}: named volume {source} is not declared"


def test_dependencies_exist_and_wait_for_what_they_need(services: dict[str, dict[str, Any]]) -> None:
    conditions = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, svc in services.items():
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert spec["condition"] in conditions
            if spec["condition"] == "service_healthy":
                assert services[dep].get("healthcheck"), f"{name} waits for {dep} healthy: no healthcheck"
    assert services["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    for name in ("worker", "replay"):
        assert services[name]["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    assert services["topics"].get("restart") == "no" and services["replay"].get("restart") == "no"


def test_the_worker_scales(services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker and "hostname" not in worker
    assert int(worker["deploy"]["replicas"]) >= 1
    assert worker["command"][:2] == ["ptt", "worker"]
    ws = _worker_settings(services, monkeypatch)
    assert ws.bootstrap_servers == "kafka:9092" and ws.web_host == "0.0.0.0"  # noqa: S104 - in the container
    assert [str(ws.web_port)] == [str(p) for p in worker["expose"]]
    assert f"127.0.0.1:{ws.web_port}/metrics" in " ".join(worker["healthcheck"]["test"])


def test_replay_command_and_environment_are_valid(services: dict[str, dict[str, Any]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    replay = services["replay"]
    assert replay["command"][:2] == ["ptt", "replay"]
    rs = _replay_settings(services, monkeypatch)
    assert rs.bootstrap_servers == "kafka:9092" and rs.speed == 60.0


def test_environment_variables_are_settings_fields(services: dict[str, dict[str, Any]]) -> None:
    models = {"worker": WorkerSettings, "replay": ReplaySettings}
    for name, model in models.items():
        fields = {f"PTT_{f.upper()}" for f in model.model_fields}
        used = {k for k in _env(services[name]) if k.startswith("PTT_")}
        assert used, name
        assert used <= fields, f"{name}: not settings: {sorted(used - fields)}"
    for name, svc in services.items():
        if name not in models:
            assert not any(k.startswith("PTT_") for k in _env(svc)), name


# -- Dockerfile ----------------------------------------------------------------------------------

def test_dockerfile_installs_the_project_from_what_it_copies() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert any(re.match(r"RUN pip install \.( |$)", ln) for ln in lines)
    copied = [src for ln in lines if ln.startswith("COPY ") for src in ln.split()[1:-1]]
    assert copied
    for src in copied:
        assert (ROOT / src).exists(), src
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert set(packages) <= set(copied) and project["project"]["readme"] in copied
    # the Dockerfile-specific ignore file (context = repo root) re-includes everything copied
    ignore = [ln.strip() for ln in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    assert ignore[0] == "*"
    allowed = {ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")}
    assert set(copied) <= allowed


# -- topics ----------------------------------------------------------------------------------------

class _FakeAdmin:
    def __init__(self, created: dict[str, tuple[int, dict[str, str]]]) -> None:
        self.created = created

    def list_topics(self) -> list[str]:
        return []

    def create_topics(self, new: list[Any]) -> None:
        for t in new:
            self.created[t.name] = (t.num_partitions, dict(t.topic_configs or {}))

    def close(self) -> None:
        pass


def _topics_the_code_creates(services: dict[str, dict[str, Any]],
                             monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[int, dict[str, str]]]:
    """What `ptt worker` and `ptt replay` would create themselves (ensure_stream_topics /
    ensure_topics) with the compose settings, captured from a fake admin client."""
    import schemas.kafka_io as kafka_io
    from stream_app.app import ensure_stream_topics

    created: dict[str, tuple[int, dict[str, str]]] = {}
    monkeypatch.setattr(kafka_io, "connect", lambda *a, **kw: _FakeAdmin(created))
    ensure_stream_topics(_worker_settings(services, monkeypatch))
    kafka_io.ensure_topics(_replay_settings(services, monkeypatch))
    return created


FAKE_KAFKA_TOPICS = r"""#!/usr/bin/env bash
# a stand-in for kafka-topics.sh: --create records "topic partitions config" once per topic,
# --describe prints them in Kafka's format
state="$FAKE_STATE"
echo "$*" >> "$FAKE_CALLS"
if [[ " $* " == *" --create "* ]]; then
  topic="" parts="" cfg=""
  while [ $# -gt 0 ]; do
    case "$1" in --topic) topic=$2; shift;; --partitions) parts=$2; shift;; --config) cfg=$2; shift;; esac
    shift
  done
  touch "$state"
  awk -v t="$topic" '$1 == t { found = 1 } END { exit !found }' "$state" || echo "$topic $parts $cfg" >> "$state"
elif [[ " $* " == *" --describe "* ]]; then
  while read -r t p c; do
    printf 'Topic: %s\tTopicId: AAAAAAAAAAAAAAAAAAAAAA\tPartitionCount: %s\tReplicationFactor: 1\tConfigs: %s\n' \
      "$t" "$p" "$c"
    for ((i = 0; i < p; i++)); do printf '\tTopic: %s\tPartition: %d\tLeader: 1\tReplicas: 1\tIsr: 1\n' "$t" "$i"; done
  done < "$state"
fi
"""


def _run_topics_script(tmp_path: Path, bootstrap: str, existing: str = "") -> tuple[subprocess.CompletedProcess[str],
                                                                                   dict[str, tuple[int, str]], str]:
    fake = tmp_path / "kafka-topics.sh"
    fake.write_text(FAKE_KAFKA_TOPICS)
    fake.chmod(0o755)
    state, calls = tmp_path / "state", tmp_path / "calls"
    state.write_text(existing)
    env = {"PATH": "/usr/bin:/bin", "BOOTSTRAP": bootstrap, "KAFKA_TOPICS": str(fake),
           "FAKE_STATE": str(state), "FAKE_CALLS": str(calls)}
    done = subprocess.run(["bash", str(TOPICS_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    topics = {}
    for line in state.read_text().splitlines():
        name, parts, *cfg = line.split()
        topics[name] = (int(parts), cfg[0] if cfg else "")
    return done, topics, calls.read_text() if calls.exists() else ""


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("awk") is None, reason="needs bash and awk")
def test_topics_service_creates_exactly_the_topics_of_the_code(services: dict[str, dict[str, Any]],
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    topics = services["topics"]
    assert topics["entrypoint"] == ["/bin/bash", "/create-topics.sh"]
    assert ("./kafka/create-topics.sh", "/create-topics.sh") in _mounts(topics)
    bootstrap = _env(topics)["BOOTSTRAP"]
    assert bootstrap == _env(services["worker"])["PTT_BOOTSTRAP_SERVERS"]

    expected = _topics_the_code_creates(services, monkeypatch)
    ws = _worker_settings(services, monkeypatch)
    assert expected[ws.reports_topic][0] == ws.partitions == 4
    assert expected[ws.partials_topic][0] == expected[ws.changelog_topic][0] == ws.internal_partitions == 4
    assert f"{ws.app_id}-__assignor-__leader" in expected

    done, created, calls = _run_topics_script(tmp_path, bootstrap)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {name: parts for name, (parts, _) in created.items()} == {n: p for n, (p, _) in expected.items()}
    # topic configs exactly as the code sets them: the queries topic and the table changelog compacted
    want_cfg = {n: ",".join(f"{k}={v}" for k, v in cfg.items()) for n, (_, cfg) in expected.items()}
    assert {name: cfg for name, (_, cfg) in created.items()} == want_cfg
    assert want_cfg[ws.queries_topic] == want_cfg[ws.changelog_topic] == "cleanup.policy=compact"
    for line in calls.splitlines():
        if "--create" in line:
            assert "--if-not-exists" in line and "--replication-factor 1" in line
            assert f"--bootstrap-server {bootstrap}" in line


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("awk") is None, reason="needs bash and awk")
def test_topics_service_fails_on_a_topic_with_the_wrong_partition_count(tmp_path: Path) -> None:
    done, _, _ = _run_topics_script(tmp_path, "kafka:9092", existing="ptt.reports 1 \n")
    assert done.returncode == 1
    assert "ptt.reports has 1 partitions, expected 4" in done.stderr


# -- Prometheus --------------------------------------------------------------------------------------

def test_prometheus_scrapes_every_worker_replica(services: dict[str, dict[str, Any]],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _yaml(PROMETHEUS)
    assert cfg["global"]["scrape_interval"] == "5s"
    port = _worker_settings(services, monkeypatch).web_port
    jobs = cfg["scrape_configs"]
    assert jobs
    hosts = []
    for job in jobs:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        for sd in job.get("dns_sd_configs", []):
            assert sd.get("type", "SRV") == "A" and int(sd["port"]) == port
            hosts += sd["names"]
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, tport = target.rpartition(":")
                assert int(tport) == port, target
                hosts.append(host)
    assert hosts and set(hosts) <= set(services), hosts
    assert "worker" in hosts  # the service name: Docker's DNS answers with every replica
    prom = services["prometheus"]
    assert ("./prometheus/prometheus.yml", "/etc/prometheus/prometheus.yml") in _mounts(prom)
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_promtool_accepts_the_prometheus_config() -> None:
    done = subprocess.run(["promtool", "check", "config", str(PROMETHEUS)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# -- Grafana -------------------------------------------------------------------------------------------

def _datasource_uids() -> set[str]:
    cfg = _yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")
    return {ds["uid"] for ds in cfg["datasources"]}


def test_grafana_provisioning(services: dict[str, dict[str, Any]]) -> None:
    ds_cfg = _yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")
    (ds,) = ds_cfg["datasources"]
    assert ds["type"] == "prometheus" and ds["uid"] == "prometheus"
    host, port = re.fullmatch(r"http://([\w.-]+):(\d+)", ds["url"]).groups()  # type: ignore[union-attr]
    assert host in services and host == "prometheus" and port == "9090"
    assert ds["jsonData"]["timeInterval"] == _yaml(PROMETHEUS)["global"]["scrape_interval"]
    providers = _yaml(GRAFANA / "provisioning" / "dashboards" / "dashboards.yml")["providers"]
    mounts = dict(_mounts(services["grafana"]))
    for kind in ("datasources", "dashboards"):
        assert mounts[f"./grafana/provisioning/{kind}"] == f"/etc/grafana/provisioning/{kind}"
    assert [p["options"]["path"] for p in providers] == [mounts["./grafana/dashboards"]]
    assert all(p["type"] == "file" for p in providers)
    home = _env(services["grafana"])["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(mounts["./grafana/dashboards"] + "/")
    assert (DASHBOARDS / Path(home).name).is_file()


def test_committed_dashboards_are_the_generators_output(dashboards: dict[str, dict[str, Any]]) -> None:
    builder = _builder()
    built = builder.build()
    assert set(built) == set(dashboards)
    for name, board in built.items():
        assert (DASHBOARDS / name).read_text() == builder.render(board), (
            f"{name} is stale: run python deploy/grafana/build_dashboards.py")


def test_dashboards_are_well_formed(dashboards: dict[str, dict[str, Any]]) -> None:
    uids = _datasource_uids()
    seen_uids = set()
    for name, board in dashboards.items():
        assert board["uid"] not in seen_uids
        seen_uids.add(board["uid"])
        assert 36 <= board["schemaVersion"] <= 41 and board["title"]
        ids = [p["id"] for p in _panels(board)]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        for panel in _panels(board):
            where = f"{name} / {panel['title']}"
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] in uids, where
            targets = panel.get("targets") or []
            assert targets and all(t.get("expr", "").strip() for t in targets), f"{where}: a target without expr"
            refs = [t["refId"] for t in targets]
            assert len(refs) == len(set(refs)), where
            for t in targets:
                assert t["datasource"]["uid"] in uids, where
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24 and pos["w"] > 0 and pos["h"] > 0, where
        for var in board["templating"]["list"]:
            if var["type"] == "query":
                assert var["datasource"]["uid"] in uids, f"{name}: variable {var['name']}"


# -- metric names and labels in the expressions ---------------------------------------------------

def _exposed() -> dict[str, set[str]]:
    """Every sample name StreamMonitor exposes -> its label names (per-station families come
    from its scrape-time collector)."""
    metrics = StreamMonitor(CollectorRegistry())
    suffixes = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count",
                                                                                  "_created"),
                "summary": ("_sum", "_count", "_created")}
    out: dict[str, set[str]] = {}
    for m in vars(metrics).values():
        if isinstance(m, MetricWrapperBase):
            for suffix in suffixes[m._type]:
                out[m._name + suffix] = set(m._labelnames)
    for family in metrics.arrays.collect():
        out[family.name] = set(family._labelnames)  # type: ignore[attr-defined]
    return out


def _strip(expr: str) -> str:
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # range selectors
    return re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)


def metric_names(expr: str) -> set[str]:
    """The metric names of a PromQL expression (functions and keywords told apart)."""
    names = set()
    stripped = _strip(expr)
    for m in re.finditer(r"(?<![\w$.])([A-Za-z_:][\w:]*)(\s*\()?", stripped):
        word, call = m.group(1), m.group(2)
        if word in PROMQL_KEYWORDS:
            continue
        if call:
            assert word in PROMQL_FUNCTIONS, f"unknown function {word} in {expr}"
        else:
            names.add(word)
    return names


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric, {label: value}) of every selector with matchers."""
    out = []
    for m in re.finditer(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}", expr):
        matchers = dict(re.findall(r'(\w+)\s*(?:=~|!~|!=|=)\s*"([^"]*)"', m.group(2)))
        out.append((m.group(1), matchers))
    return out


def test_the_expression_parser() -> None:
    expr = ('max by (query) (ptt_estimate_vehicles{station="$station", estimator="rr"} and on (instance, query) '
            '(ptt_last_closed_epoch == on (query) group_left max by (query) (ptt_last_closed_epoch))) '
            'or sum(rate(ptt_reports_total[$__rate_interval]))')
    assert metric_names(expr) == {"ptt_estimate_vehicles", "ptt_last_closed_epoch", "ptt_reports_total"}
    assert selectors(expr) == [("ptt_estimate_vehicles", {"station": "$station", "estimator": "rr"})]
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(faust_x_bucket[1m])))") == {"faust_x_bucket"}


def _targets(dashboards: dict[str, dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for name, board in dashboards.items():
        for panel in _panels(board):
            for t in panel.get("targets") or []:
                yield name, panel, t


def test_every_metric_in_the_dashboards_exists(dashboards: dict[str, dict[str, Any]]) -> None:
    exposed = _exposed()
    assert "ptt_reports_total" in exposed and "ptt_estimate_vehicles" in exposed  # the counter/gauge naming
    confidences = {f"{c:g}" for c in WorkerSettings().confidences}
    estimator_names = {"sp_difference", "rr", *E.alp_estimators(E.alp_optimal())}
    used: set[str] = set()
    for name, panel, t in _targets(dashboards):
        where = f"{name} / {panel['title']}: {t['expr']}"
        for metric in metric_names(t["expr"]):
            used.add(metric)
            assert metric in exposed or metric.startswith("faust_"), f"unknown metric {metric} in {where}"
        for metric, matchers in selectors(t["expr"]):
            if metric.startswith("faust_"):
                continue
            assert set(matchers) <= exposed[metric] | TARGET_LABELS, f"unknown label in {where}"
            if "confidence" in matchers:
                assert matchers["confidence"] in confidences, where
            if "estimator" in matchers:
                assert matchers["estimator"] in estimator_names, where
            if "mechanism" in matchers:
                assert matchers["mechanism"] in {"sp", "alp", "rr"}, where
        for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")):
            assert re.search(rf"\b{label}\b", t["expr"]) or label in TARGET_LABELS, f"legend {label}: {where}"
    # the brief's panels are all there
    assert {"ptt_epoch_reports", "ptt_epoch_lag_epochs", "ptt_late_records_total", "ptt_dead_letters_total",
            "ptt_refused_vehicles_total", "ptt_suppressed_estimates_total", "ptt_epochs_closed_total",
            "ptt_reports_total", "ptt_estimate_vehicles", "ptt_estimate_lower_vehicles",
            "ptt_estimate_upper_vehicles", "ptt_ground_truth_vehicles", "ptt_query_epsilon",
            "ptt_query_crowd_size_vehicles"} <= used


def test_station_dashboard_has_a_panel_per_mechanism_with_bands_and_truth(
        dashboards: dict[str, dict[str, Any]]) -> None:
    board = dashboards["station.json"]
    wanted = {"sp": {"sp_difference"}, "alp": {"alp_average"}, "rr": {"rr"}}
    for mechanism, estimators in wanted.items():
        panels = [p for p in _panels(board) if any(f'mechanism="{mechanism}"' in t["expr"] for t in p["targets"])]
        assert len(panels) == 1, mechanism
        exprs = [t["expr"] for t in panels[0]["targets"]]
        for estimator in estimators:
            for metric in ("ptt_estimate_vehicles", "ptt_estimate_lower_vehicles", "ptt_estimate_upper_vehicles"):
                assert any(metric + "{" in e and f'estimator="{estimator}"' in e for e in exprs), (mechanism, metric)
            for level in ("0.95", "0.99"):
                for metric in ("ptt_estimate_lower_vehicles", "ptt_estimate_upper_vehicles"):
                    assert any(metric in e and f'confidence="{level}"' in e for e in exprs), (mechanism, level)
        assert any("ptt_ground_truth_vehicles" in e for e in exprs)
        # every band's upper series fills down to its lower series
        fills = {prop["value"] for o in panels[0]["fieldConfig"]["overrides"] for prop in o["properties"]
                 if prop["id"] == "custom.fillBelowTo"}
        legends = {t["legendFormat"] for t in panels[0]["targets"]}
        assert fills == {"95% lower", "99% lower"} and fills <= legends
    stats = [p for p in _panels(board) if p["type"] == "stat"]
    stat_exprs = " ".join(t["expr"] for p in stats for t in p["targets"])
    assert "ptt_query_epsilon" in stat_exprs
    assert 'statistic="mean"' in stat_exprs and 'statistic="p01"' in stat_exprs


def test_template_variables_are_defined(dashboards: dict[str, dict[str, Any]]) -> None:
    exposed = _exposed()
    for name, board in dashboards.items():
        defined = {v["name"] for v in board["templating"]["list"]}
        for var in board["templating"]["list"]:
            m = re.fullmatch(r"label_values\((?:(\w+)(\{[^}]*\})?\s*,\s*)?(\w+)\)", var["query"])
            assert m, f"{name}: variable {var['name']}: {var['query']}"
            if m.group(1):
                assert m.group(1) in exposed and m.group(3) in exposed[m.group(1)], var["query"]
        texts = [p["title"] for p in _panels(board)] + [t["expr"] for _, _, t in _targets({name: board})]
        texts += [v["query"] for v in board["templating"]["list"]]
        for text in texts:
            for var in re.findall(r"\$\{?(\w+)", text) + re.findall(r"\[\[(\w+)\]\]", text):
                assert var in defined or var in GRAFANA_GLOBALS, f"{name}: ${var} is not defined ({text})"
    station = {v["name"]: v for v in dashboards["station.json"]["templating"]["list"]}
    assert station["station"]["query"] == "label_values(ptt_estimate_vehicles, station)"
    assert set(station) == {"station", "query"}
