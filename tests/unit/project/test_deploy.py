"""deploy/: the compose file, Dockerfile, topic script, Prometheus and Grafana configuration and
the dashboards agree with each other and with the code (settings, CLI, metrics). No network,
no Docker: everything is parsed, the topic, user and ACL scripts run against fake
kafka-topics.sh / kafka-configs.sh / kafka-acls.sh, the ACLs are held against what each
principal's code asks of the broker (its Kafka clients run against a recorder, the worker's
Faust app is read), and promtool checks the Prometheus configuration when it is installed."""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from pydantic import SecretStr

import estimators as E
from producers.settings import ReplaySettings
from schemas.settings import KafkaSettings
from stream_app.cli import build_parser
from stream_app.cli.base import settings_from_args
from stream_app.settings import WorkerSettings
from stream_app.shuffler.settings import ShufflerSettings
from stream_app.worker.metrics import StreamMonitor
from tests.devices import ENROLLMENT_SECRET
from tests.paths import ROOT

DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
GRAFANA = DEPLOY / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
KAFKA_DIR = DEPLOY / "kafka"
TOPICS_SCRIPT = KAFKA_DIR / "create-topics.sh"
USERS_SCRIPT = KAFKA_DIR / "create-users.sh"
ACLS_SCRIPT = KAFKA_DIR / "create-acls.sh"
DEMO_QUERIES_SCRIPT = KAFKA_DIR / "publish-demo-queries.py"
ENV_EXAMPLE = DEPLOY / ".env.example"
KAFKA_MOUNT = ("./kafka", "/ptt-kafka")  # the scripts, mounted read-only where they run
ADMIN_JOBS = ("kafka-users", "kafka-acls", "topics")  # one-shot, as the admin principal
# the services that run the project's code, and the settings their PTT_* variables must be
CLIENTS: dict[str, type[KafkaSettings]] = {"worker": WorkerSettings, "replay": ReplaySettings,
                                           "queries": ReplaySettings, "analyst": KafkaSettings,
                                           "subscriber": KafkaSettings, "shuffler": ShufflerSettings}
SECURITY_FIELDS = {"PTT_SECURITY_PROTOCOL", "PTT_SASL_MECHANISM", "PTT_SASL_PLAIN_USERNAME",
                   "PTT_SASL_PLAIN_PASSWORD"}

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


_VARIABLE = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: str, variables: dict[str, str] | None = None) -> str:
    """docker compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` with ``variables``
    as the environment / .env file (none: every default)."""
    variables = variables or {}

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        if variables.get(name):
            return variables[name]
        if op.endswith("-"):
            return arg
        raise AssertionError(f"${{{name}}} has no default: {arg or 'unset'}")

    return _VARIABLE.sub(one, value)


def _env(service: dict[str, Any], variables: dict[str, str] | None = None) -> dict[str, str]:
    """A service's environment as its container sees it (compose variables interpolated)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): interpolate(str(v), variables) for k, v in env.items()}


def _raw_env(service: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (service.get("environment") or {}).items()}


def _kafka_properties(env: dict[str, str]) -> dict[str, str]:
    """server.properties as the apache/kafka image writes it from KAFKA_* variables: prefix
    dropped, lower case, ``_`` -> ``.``, then ``...`` -> ``-`` and ``..`` -> ``_``."""
    skip = {"KAFKA_HEAP_OPTS", "KAFKA_OPTS", "KAFKA_LOG4J_OPTS", "KAFKA_JMX_OPTS", "KAFKA_VERSION"}
    props = {}
    for key, value in env.items():
        if key.startswith("KAFKA_") and key not in skip:
            name = key.removeprefix("KAFKA_").lower().replace("_", ".").replace("...", "-").replace("..", "_")
            props[name] = value
    return props


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


def _shuffler_settings(services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> ShufflerSettings:
    """What `ptt shuffler` in the shuffler container runs with: its command line and environment."""
    _settings_in_env(monkeypatch, _env(services["shuffler"]))
    args = build_parser().parse_args(services["shuffler"]["command"][1:])
    return settings_from_args(ShufflerSettings, args)


def _replay_settings(services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> ReplaySettings:
    _settings_in_env(monkeypatch, _env(services["replay"]))
    args = build_parser().parse_args(services["replay"]["command"][1:])
    return settings_from_args(ReplaySettings, args)


# -- docker compose ----------------------------------------------------------------------------

def test_compose_services_have_an_image_or_a_build(compose: dict[str, Any],
                                                   services: dict[str, dict[str, Any]]) -> None:
    assert "version" not in compose  # the compose spec has no version
    assert {"kafka", "topics", "worker", "shuffler", "replay", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        assert svc.get("image") or svc.get("build"), f"{name}: neither image nor build"
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["topics"]["image"] == services["kafka"]["image"]
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    assert services["grafana"]["image"].startswith("grafana/grafana:")
    for name in ("worker", "shuffler", "replay"):  # the project image, built from deploy/Dockerfile
        assert services[name]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert services["worker"]["image"] == services["replay"]["image"] == services["shuffler"]["image"]


def test_kafka_runs_in_kraft_mode(services: dict[str, dict[str, Any]]) -> None:
    env = _env(services["kafka"])
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{node}@kafka:9093"
    assert "CONTROLLER://:9093" in env["KAFKA_LISTENERS"].split(",")
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", env["CLUSTER_ID"])  # a base64url UUID
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # topics come from the topics service
    assert services["kafka"]["healthcheck"]["test"]


def _listeners(props: dict[str, str]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(name -> bind address, name -> advertised address, name -> security protocol)."""
    def split(value: str) -> dict[str, str]:
        return dict(item.split("://", 1) for item in value.split(","))
    protocols = dict(p.split(":") for p in props["listener.security.protocol.map"].split(","))
    return split(props["listeners"]), split(props["advertised.listeners"]), protocols


def test_every_listener_requires_sasl_and_the_services_get_scram(services: dict[str, dict[str, Any]]) -> None:
    props = _kafka_properties(_env(services["kafka"]))
    bind, advertised, protocols = _listeners(props)
    assert set(bind) == set(protocols)
    assert all(protocols[name] in ("SASL_PLAINTEXT", "SASL_SSL") for name in bind), protocols  # no PLAINTEXT
    # every listener names its mechanisms; the JAAS config of each mechanism is there
    modules = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule required",
               "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule required"}
    mechanisms = {}
    for name in bind:
        prefix = f"listener.name.{name.lower()}"
        mechanisms[name] = props[f"{prefix}.sasl.enabled.mechanisms"].split(",")
        for mech in mechanisms[name]:
            assert props[f"{prefix}.{mech.lower()}.sasl.jaas.config"].startswith(modules[mech]), (name, mech)
    assert "sasl.enabled.mechanisms" not in props  # no listener falls back to the default (GSSAPI)
    # the services' listener (and the host's) take SCRAM-SHA-512 only
    by_address = {addr: name for name, addr in advertised.items()}
    for svc in CLIENTS:
        env = _env(services[svc])
        listener = by_address[env["PTT_BOOTSTRAP_SERVERS"]]
        assert mechanisms[listener] == ["SCRAM-SHA-512"], svc
        assert protocols[listener] == env["PTT_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT", svc
        assert env["PTT_SASL_MECHANISM"] == "SCRAM-SHA-512", svc
    assert mechanisms[by_address["localhost:29092"]] == ["SCRAM-SHA-512"]
    assert services["kafka"]["ports"] == ["127.0.0.1:29092:29092"]  # only the HOST listener, only on loopback
    # the admin: PLAIN on the controller and broker listeners, the only super user
    assert props["controller.listener.names"] == "CONTROLLER"
    broker = props["inter.broker.listener.name"]
    for name in ("CONTROLLER", broker):
        assert mechanisms[name] == ["PLAIN"], name
        jaas = props[f"listener.name.{name.lower()}.plain.sasl.jaas.config"]
        users = dict(re.findall(r'(\w+)="([^"]*)"', jaas))
        assert users["username"] == "admin" and users["password"] == users["user_admin"]
        assert set(users) == {"username", "password", "user_admin"}, "the admin is the only PLAIN user"
    assert props["sasl.mechanism.controller.protocol"] == props["sasl.mechanism.inter.broker.protocol"] == "PLAIN"
    assert broker not in {by_address[_env(services[svc])["PTT_BOOTSTRAP_SERVERS"]] for svc in CLIENTS}
    # deny unless an ACL grants; admin only bypasses
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:admin"


def test_passwords_come_from_variables_with_marked_example_defaults(services: dict[str, dict[str, Any]]) -> None:
    """No literal secret: every password is a ${VARIABLE:-example-...-CHANGE-ME} and .env.example
    lists every variable the compose file uses."""
    text = COMPOSE.read_text()
    used = set()
    for m in _VARIABLE.finditer(text):
        used.add(m.group(1))
        if "PASSWORD" in m.group(1) and m.group(1) != "GRAFANA_ADMIN_PASSWORD":
            assert m.group(2) == ":-" and re.fullmatch(r"example-\w+-CHANGE-ME", m.group(3) or ""), m.group(0)
    for name, svc in services.items():
        for key, value in _raw_env(svc).items():
            if "PASSWORD" in key:
                assert value.startswith("${") and value.endswith("}"), f"{name}: {key} is a literal"
    jaas = _raw_env(services["kafka"])["KAFKA_LISTENER_NAME_BROKER_PLAIN_SASL_JAAS_CONFIG"]
    assert 'password="${KAFKA_ADMIN_PASSWORD:-' in jaas
    example = dict(line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
                   if line.strip() and not line.startswith("#"))
    assert set(example) == used
    assert (DEPLOY / ".gitignore").read_text().splitlines()[-1] == ".env"  # the real one stays out of git


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
    for job in ADMIN_JOBS:
        assert services[job]["depends_on"]["kafka"]["condition"] == "service_healthy"
        assert services[job].get("restart") == "no"
    # users, ACLs and topics exist before any client of the project runs
    for name in ("worker", "shuffler", "replay", "queries"):
        for job in ADMIN_JOBS:
            assert services[name]["depends_on"][job]["condition"] == "service_completed_successfully", (name, job)
    for name in ("analyst", "subscriber"):
        for job in ("kafka-users", "kafka-acls"):
            assert services[name]["depends_on"][job]["condition"] == "service_completed_successfully", (name, job)
        assert services[name]["profiles"] == ["tools"]  # not started by `up`
    # the replay starts once the demo queries are published (by the analyst) and a worker runs
    assert services["replay"]["depends_on"]["queries"]["condition"] == "service_completed_successfully"
    assert services["replay"]["depends_on"]["worker"]["condition"] == "service_healthy"
    for name in ("replay", "queries"):
        assert services[name].get("restart") == "no"
    for name in ("worker", "shuffler"):  # long-running, restarted; only after the broker is healthy
        assert services[name]["depends_on"]["kafka"]["condition"] == "service_healthy", name
        assert services[name]["restart"] == "unless-stopped", name


def test_the_worker_scales(services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker and "hostname" not in worker
    assert int(worker["deploy"]["replicas"]) >= 1
    assert worker["command"][:2] == ["ptt", "worker"]
    ws = _worker_settings(services, monkeypatch)
    assert ws.bootstrap_servers == "kafka:9092" and ws.web_host == "0.0.0.0"  # noqa: S104 - in the container
    assert [str(ws.web_port)] == [str(p) for p in worker["expose"]]
    assert f"127.0.0.1:{ws.web_port}/metrics" in " ".join(worker["healthcheck"]["test"])


def test_the_shuffler_runs_one_instance_with_its_metrics_served(services: dict[str, dict[str, Any]],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    shuffler = services["shuffler"]
    assert shuffler["command"][:2] == ["ptt", "shuffler"]
    assert "deploy" not in shuffler  # one instance: its index is in its settings
    ss = _shuffler_settings(services, monkeypatch)
    assert ss.bootstrap_servers == "kafka:9092" and ss.metrics_host == "0.0.0.0"  # noqa: S104 - in the container
    assert (ss.instance_index, ss.instance_count) == (0, 1)
    assert ss.transactional_id == "ptt-shuffler-0" and ss.state_topic == "ptt-shuffler-state-0"
    assert ss.fault_hold_s == 0  # the fault injection of the crash tests stays off
    assert ss.metrics_port and [str(ss.metrics_port), str(ss.http_port)] == [str(p) for p in shuffler["expose"]]
    assert f"127.0.0.1:{ss.metrics_port}/metrics" in " ".join(shuffler["healthcheck"]["test"])
    assert ss.metrics_port != _worker_settings(services, monkeypatch).web_port


def test_the_shuffler_serves_its_front_door_behind_nginx(services: dict[str, dict[str, Any]],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The compose file starts the door (PTT_HTTP_PORT = SHUFFLER_HTTP_PORT, 8080 by default)
    on the compose network only, with nginx (``door-proxy``, nginx/nginx.conf) in front of it
    published on the host's loopback; the door's file-descriptor limit leaves its connection cap
    its default; nginx's limits are no looser than the door's and it logs and forwards nothing
    that names a client; SHUFFLER_HTTP_PORT=0 turns the door off."""
    from stream_app.shuffler.front_door import FD_RESERVE

    shuffler, proxy = services["shuffler"], services["door-proxy"]
    ss = _shuffler_settings(services, monkeypatch)
    assert ss.http_port == 8080 and ss.http_host == "0.0.0.0"  # noqa: S104 - in the container
    assert ss.http_port != ss.metrics_port and "ports" not in shuffler
    assert str(ss.http_port) in [str(p) for p in shuffler["expose"]]
    assert int(shuffler["ulimits"]["nofile"]) - FD_RESERVE >= ss.http_max_connections
    assert ss.http_idle_timeout_s <= 30 and ss.http_body_timeout_s <= 30  # slow clients are timed out
    # nginx: the shipped configuration, mounted whole; its upstream is the door
    assert proxy["image"].startswith("nginx:") and proxy["ports"] == ["127.0.0.1:8080:8080"]
    assert ("./nginx/nginx.conf", "/etc/nginx/nginx.conf") in _mounts(proxy)
    assert proxy["depends_on"]["shuffler"]["condition"] == "service_healthy"
    conf = (DEPLOY / "nginx" / "nginx.conf").read_text()
    code = "\n".join(line.split("#", 1)[0] for line in conf.splitlines())

    def directive(name: str) -> list[str]:
        return re.findall(rf"^[ \t]*{name}[ \t]+([^;{{}}\n]+);", code, re.M)

    assert directive("server") == [f"shuffler:{ss.http_port}"] and directive("listen") == ["8080 backlog=4096"]
    assert directive("client_max_body_size") == [f"{ss.http_max_body_bytes // 1024}k"]
    for name in ("client_header_timeout", "client_body_timeout", "keepalive_timeout"):
        (value,) = directive(name)
        assert float(value.removesuffix("s")) <= ss.http_idle_timeout_s, name
    assert directive("access_log") == ["off"] and directive("error_log") == ["stderr crit"]
    assert "remote_addr" not in code and "X-Forwarded" not in code and "X-Real-IP" not in code
    assert not directive("daemon") and not directive("pid")  # the image's command gives them
    assert int(proxy["ulimits"]["nofile"]) >= int(directive("worker_connections")[0])
    _settings_in_env(monkeypatch, _env(shuffler, {"SHUFFLER_HTTP_PORT": "0"}))
    off = settings_from_args(ShufflerSettings, build_parser().parse_args(shuffler["command"][1:]))
    assert off.http_port == 0


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_shuffler_may_write_the_device_topic_only_with_its_door(services: dict[str, dict[str, Any]],
                                                                    tmp_path: Path) -> None:
    """create-acls.sh grants the shuffler WRITE on the device topic exactly when the compose
    file starts its front door (the acls job's SHUFFLER_HTTP_PORT is the shuffler's
    PTT_HTTP_PORT), and nothing else changes with it."""
    assert _raw_env(services["kafka-acls"])["SHUFFLER_HTTP_PORT"] == _raw_env(services["shuffler"])["PTT_HTTP_PORT"]
    device_topic = ShufflerSettings().device_topic
    grants = {}
    for port in ("8080", "0"):
        (tmp_path / port).mkdir()
        env = {**_job_env(services, "kafka-acls"), **_env(services["kafka-acls"], {"SHUFFLER_HTTP_PORT": port})}
        done, calls, _ = _run_recorded(tmp_path / port, ACLS_SCRIPT, "KAFKA_ACLS", env)
        assert done.returncode == 0, done.stderr
        grants[port] = set(_granted(calls))
    door = ("shuffler", "WRITE", "TOPIC", device_topic, "LITERAL")
    assert door in grants["8080"] and door not in grants["0"]
    assert grants["8080"] - grants["0"] == {door}


def test_replay_command_and_environment_are_valid(services: dict[str, dict[str, Any]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    replay = services["replay"]
    assert replay["command"][:2] == ["ptt", "replay"]
    rs = _replay_settings(services, monkeypatch)
    assert rs.bootstrap_servers == "kafka:9092" and rs.speed == 60.0


def test_environment_variables_are_settings_fields(services: dict[str, dict[str, Any]]) -> None:
    for name, model in CLIENTS.items():
        fields = {f"PTT_{f.upper()}" for f in model.model_fields}
        used = {k for k in _env(services[name]) if k.startswith("PTT_")}
        assert used, name
        assert used <= fields, f"{name}: not settings: {sorted(used - fields)}"
        model()  # the settings parse  # noqa: B018
    kafka_fields = {f"PTT_{f.upper()}" for f in KafkaSettings.model_fields}
    for job in ADMIN_JOBS:  # the Kafka CLI jobs read the same names (kafka/client-properties.sh)
        used = {k for k in _env(services[job]) if k.startswith("PTT_")}
        assert used == SECURITY_FIELDS and used <= kafka_fields, job
    for name, svc in services.items():
        if name not in CLIENTS and name not in ADMIN_JOBS:
            assert not any(k.startswith("PTT_") for k in _env(svc)), name


def test_every_client_authenticates_as_its_own_principal(services: dict[str, dict[str, Any]],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    principals = {"worker": "worker", "replay": "replay", "queries": "analyst", "analyst": "analyst",
                  "subscriber": "subscriber", "shuffler": "shuffler"}
    for name, user in principals.items():
        _settings_in_env(monkeypatch, _env(services[name]))
        settings = CLIENTS[name]()
        assert settings.sasl_plain_username == user, name
        kw = settings.client_kwargs()
        assert kw["security_protocol"] == "SASL_PLAINTEXT" and kw["sasl_mechanism"] == "SCRAM-SHA-512", name
        assert kw["sasl_plain_password"], name
    assert _worker_settings(services, monkeypatch).sasl_plain_username == "worker"
    assert _shuffler_settings(services, monkeypatch).sasl_plain_username == "shuffler"
    assert _replay_settings(services, monkeypatch).default_queries is False  # the gateway writes no query


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

    def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:  # ensure_topics waits until shown
        return [{"name": n, "error_code": 0 if n in self.created else 3, "topic_id": f"id-{n}"} for n in names]

    def close(self) -> None:
        pass


def _topics_the_code_creates(services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
                             commands: tuple[str, ...] = ("worker", "replay", "shuffler"),
                             ) -> dict[str, tuple[int, dict[str, str]]]:
    """What `ptt worker`, `ptt replay` and `ptt shuffler` would create themselves
    (ensure_stream_topics / ensure_topics) with the compose settings, captured from a fake admin
    client (``commands``: only those)."""
    import schemas.kafka_io as kafka_io
    from stream_app.shuffler.runtime import shuffler_topics
    from stream_app.worker.app import ensure_stream_topics

    created: dict[str, tuple[int, dict[str, str]]] = {}
    monkeypatch.setattr(kafka_io, "connect", lambda *a, **kw: _FakeAdmin(created))
    if "worker" in commands:
        ensure_stream_topics(_worker_settings(services, monkeypatch))
    if "replay" in commands:
        kafka_io.ensure_topics(_replay_settings(services, monkeypatch))
    if "shuffler" in commands:
        ss = _shuffler_settings(services, monkeypatch)
        topics, compacted = shuffler_topics(ss)
        kafka_io.ensure_topics(ss, topics, compacted=compacted)
    return created


FAKE_KAFKA_TOPICS = r"""#!/usr/bin/env bash
# a stand-in for kafka-topics.sh: --create records "topic partitions config" once per topic,
# --describe prints them in Kafka's format
state="$FAKE_STATE"
echo "$*" >> "$FAKE_CALLS"
for ((i = 1; i < $#; i++)); do
  if [ "${!i}" = --command-config ]; then j=$((i + 1)); cat "${!j}" >> "$FAKE_CALLS.config"; fi
done
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


def _job_env(services: dict[str, dict[str, Any]], job: str, **extra: str) -> dict[str, str]:
    """A one-shot job's environment (interpolated) plus a minimal PATH."""
    return {"PATH": "/usr/bin:/bin", **_env(services[job]), **extra}


def _run_topics_script(tmp_path: Path, env: dict[str, str], existing: str = ""
                       ) -> tuple[subprocess.CompletedProcess[str], dict[str, tuple[int, str]], str]:
    fake = tmp_path / "kafka-topics.sh"
    fake.write_text(FAKE_KAFKA_TOPICS)
    fake.chmod(0o755)
    state, calls = tmp_path / "state", tmp_path / "calls"
    state.write_text(existing)
    env = {**env, "KAFKA_TOPICS": str(fake), "FAKE_STATE": str(state), "FAKE_CALLS": str(calls)}
    done = subprocess.run(["bash", str(TOPICS_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    topics = {}
    for line in state.read_text().splitlines():
        name, parts, *cfg = line.split()
        topics[name] = (int(parts), cfg[0] if cfg else "")
    return done, topics, calls.read_text() if calls.exists() else ""


def _admin_properties(env: dict[str, str]) -> str:
    """The --command-config client-properties.sh must write for the admin jobs."""
    return ("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="admin" password="{env["PTT_SASL_PLAIN_PASSWORD"]}";\n')


def test_the_jobs_run_the_mounted_scripts_as_admin_on_the_broker_listener(
        services: dict[str, dict[str, Any]]) -> None:
    scripts = {"kafka-users": "create-users.sh", "kafka-acls": "create-acls.sh", "topics": "create-topics.sh"}
    props = _kafka_properties(_env(services["kafka"]))
    _, advertised, _ = _listeners(props)
    jaas = props["listener.name.broker.plain.sasl.jaas.config"]
    admin_password = dict(re.findall(r'(\w+)="([^"]*)"', jaas))["user_admin"]
    for job, script in scripts.items():
        svc = services[job]
        assert svc["image"] == services["kafka"]["image"]
        assert svc["entrypoint"] == ["/bin/bash", f"{KAFKA_MOUNT[1]}/{script}"]
        assert KAFKA_MOUNT in _mounts(svc) and (KAFKA_DIR / script).is_file()
        env = _env(svc)
        assert env["BOOTSTRAP"] == advertised[props["inter.broker.listener.name"]]
        assert env["PTT_SASL_PLAIN_USERNAME"] == "admin" and env["PTT_SASL_MECHANISM"] == "PLAIN"
        assert env["PTT_SASL_PLAIN_PASSWORD"] == admin_password, job
    # the healthcheck authenticates as admin too
    assert services["kafka"]["healthcheck"]["test"] == ["CMD", "/bin/bash", f"{KAFKA_MOUNT[1]}/healthcheck.sh"]
    assert KAFKA_MOUNT in _mounts(services["kafka"])
    assert _env(services["kafka"])["ADMIN_PASSWORD"] == admin_password
    # a different variable value reaches every admin place at once
    variables = {"KAFKA_ADMIN_PASSWORD": "rotated-admin-password"}
    assert 'password="rotated-admin-password"' in _env(services["kafka"], variables)[
        "KAFKA_LISTENER_NAME_CONTROLLER_PLAIN_SASL_JAAS_CONFIG"]
    assert {_env(services[job], variables)["PTT_SASL_PLAIN_PASSWORD"] for job in ADMIN_JOBS} == {
        "rotated-admin-password"}


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("awk") is None, reason="needs bash and awk")
def test_topics_service_creates_exactly_the_topics_of_the_code(services: dict[str, dict[str, Any]],
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    env = _job_env(services, "topics")
    bootstrap = env["BOOTSTRAP"]

    expected = _topics_the_code_creates(services, monkeypatch)
    ws = _worker_settings(services, monkeypatch)
    assert expected[ws.reports_topic][0] == ws.partitions == 4
    assert expected[ws.partials_topic][0] == expected[ws.changelog_topic][0] == ws.internal_partitions == 4
    assert f"{ws.app_id}-__assignor-__leader" in expected

    done, created, calls = _run_topics_script(tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {name: parts for name, (parts, _) in created.items()} == {n: p for n, (p, _) in expected.items()}
    # topic configs exactly as the code sets them: the queries topic and the table changelog compacted
    want_cfg = {n: ",".join(f"{k}={v}" for k, v in cfg.items()) for n, (_, cfg) in expected.items()}
    assert {name: cfg for name, (_, cfg) in created.items()} == want_cfg
    assert want_cfg[ws.queries_topic] == want_cfg[ws.changelog_topic] == "cleanup.policy=compact"
    ss = _shuffler_settings(services, monkeypatch)  # the shuffler's input and its (compacted) state log
    assert created[ss.device_topic] == (ss.device_partitions, "") and ss.device_topic == "ptt.device-reports"
    assert created[ss.state_topic] == (1, "cleanup.policy=compact") and ss.state_topic == "ptt-shuffler-state-0"
    lines = calls.splitlines()
    assert len(lines) == len(expected) + 1  # one --create per topic, one --describe
    for line in lines:
        assert f"--bootstrap-server {bootstrap} --command-config " in line
        if "--create" in line:
            assert "--if-not-exists" in line and "--replication-factor 1" in line
    # every call authenticated as admin; the properties file is gone afterwards
    assert (tmp_path / "calls.config").read_text() == _admin_properties(env) * len(lines)
    assert not Path(lines[0].split("--command-config ")[1].split()[0]).exists()


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("awk") is None, reason="needs bash and awk")
def test_topics_service_fails_on_a_topic_with_the_wrong_partition_count(services: dict[str, dict[str, Any]],
                                                                        tmp_path: Path) -> None:
    done, _, _ = _run_topics_script(tmp_path, _job_env(services, "topics"), existing="ptt.reports 1 \n")
    assert done.returncode == 1
    assert "ptt.reports has 1 partitions, expected 4" in done.stderr


def test_the_jobs_refuse_missing_or_unsafe_credentials(services: dict[str, dict[str, Any]],
                                                       tmp_path: Path) -> None:
    for password, message in (("", "PTT_SASL_PLAIN_PASSWORD is not set"),
                              ('bad"quote', "PTT_SASL_PLAIN_PASSWORD contains a character"),
                              ("a,b", "PTT_SASL_PLAIN_PASSWORD contains a character")):
        env = _job_env(services, "topics", PTT_SASL_PLAIN_PASSWORD=password, KAFKA_TOPICS="/bin/false")
        done = subprocess.run(["bash", str(TOPICS_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and message in done.stderr, (password, done.stderr)
    env = _job_env(services, "kafka-users", WORKER_PASSWORD="", KAFKA_CONFIGS="/bin/false")
    done = subprocess.run(["bash", str(USERS_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "WORKER_PASSWORD is not set" in done.stderr


# -- users, quotas and ACLs --------------------------------------------------------------------------

FAKE_RECORDER = r"""#!/usr/bin/env bash
# a stand-in for kafka-configs.sh / kafka-acls.sh: one line per call, arguments separated by \x1f;
# the --command-config file is appended to $FAKE_CALLS.config
( IFS=$'\x1f'; echo "$*" ) >> "$FAKE_CALLS"
for ((i = 1; i < $#; i++)); do
  if [ "${!i}" = --command-config ]; then j=$((i + 1)); cat "${!j}" >> "$FAKE_CALLS.config"; fi
done
"""


def _run_recorded(tmp_path: Path, script: Path, tool_var: str, env: dict[str, str]
                  ) -> tuple[subprocess.CompletedProcess[str], list[list[str]], str]:
    fake = tmp_path / "fake-kafka-tool.sh"
    fake.write_text(FAKE_RECORDER)
    fake.chmod(0o755)
    calls = tmp_path / "calls"
    env = {**env, tool_var: str(fake), "FAKE_CALLS": str(calls)}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    lines = [line.split("\x1f") for line in calls.read_text().splitlines()] if calls.exists() else []
    config = (tmp_path / "calls.config").read_text() if (tmp_path / "calls.config").exists() else ""
    return done, lines, config


def _flag(args: list[str], name: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == name]


def _users_and_quotas(services: dict[str, dict[str, Any]], tmp_path: Path
                      ) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Run create-users.sh against a fake kafka-configs.sh: (user -> SCRAM password, user -> quotas)."""
    env = _job_env(services, "kafka-users")
    done, calls, config = _run_recorded(tmp_path, USERS_SCRIPT, "KAFKA_CONFIGS", env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert config == _admin_properties(env) * len(calls)
    scram: dict[str, str] = {}
    quotas: dict[str, dict[str, str]] = {}
    for args in calls:
        assert args[:2] == ["--bootstrap-server", env["BOOTSTRAP"]] and "--alter" in args
        assert _flag(args, "--entity-type") == ["users"]
        (user,) = _flag(args, "--entity-name")
        (config_value,) = _flag(args, "--add-config")
        m = re.fullmatch(r"SCRAM-SHA-512=\[iterations=(\d+),password=([^\]]+)\]", config_value)
        if m:
            assert int(m.group(1)) >= 4096 and user not in scram
            scram[user] = m.group(2)
        else:
            assert user not in quotas
            quotas[user] = dict(item.split("=") for item in config_value.split(","))
    return scram, quotas


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_every_client_credential_matches_a_scram_user_of_the_users_job(services: dict[str, dict[str, Any]],
                                                                        tmp_path: Path) -> None:
    scram, _ = _users_and_quotas(services, tmp_path)
    assert set(scram) == {"device", "replay", "worker", "analyst", "subscriber", "shuffler"}
    assert "admin" not in scram  # the admin is not a SCRAM user: it cannot log in on the services' listener
    for name in CLIENTS:
        env = _env(services[name])
        user = env["PTT_SASL_PLAIN_USERNAME"]
        assert scram[user] == env["PTT_SASL_PLAIN_PASSWORD"], name
    assert len(set(scram.values())) == len(scram)  # one password per principal
    # with real passwords in the environment, users and clients still agree
    variables = {f"{u.upper()}_PASSWORD": f"real-{u}-secret-{i}" for i, u in enumerate(scram)}
    (tmp_path / "real").mkdir()
    env = _job_env(services, "kafka-users")
    env.update({k: interpolate(str(v), variables) for k, v in _raw_env(services["kafka-users"]).items()})
    done, calls, _ = _run_recorded(tmp_path / "real", USERS_SCRIPT, "KAFKA_CONFIGS", env)
    assert done.returncode == 0, done.stderr
    created = " ".join(a for args in calls for a in args)
    for name in CLIENTS:
        password = _env(services[name], variables)["PTT_SASL_PLAIN_PASSWORD"]
        assert password.startswith("real-") and f"password={password}]" in created, name


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_quotas_cap_the_writers(services: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    _, quotas = _users_and_quotas(services, tmp_path)
    assert set(quotas) == {"device", "replay", "analyst", "subscriber"}  # the worker and shuffler are not throttled
    assert 0 < int(quotas["device"]["producer_byte_rate"]) <= 10 * 1024 * 1024
    assert 0 < float(quotas["device"]["request_percentage"]) <= 100
    assert int(quotas["device"]["producer_byte_rate"]) < int(quotas["replay"]["producer_byte_rate"])
    assert int(quotas["analyst"]["producer_byte_rate"]) <= 1024 * 1024  # queries are small
    assert int(quotas["subscriber"]["consumer_byte_rate"]) > 0
    known = {"producer_byte_rate", "consumer_byte_rate", "request_percentage"}
    assert all(set(q) <= known for q in quotas.values())


Grant = tuple[str, str, str, str, str]  # (principal, operation, resource type, name, pattern type)
Use = tuple[str, str, str, str]  # (principal, operation, resource type, name): what a client asks of the broker


class _Cluster:
    """A stand-in for kafka-python's clients that records, per principal (the SASL user the
    client authenticates as), what the project's code asks of the broker -- the embedded
    broker has no ACLs to tell. Its topics are those the `topics` job creates; records sent
    are kept, so what one client publishes another reads (the demo queries, say).

    What counts as a use: sending to a topic is WRITE; assigning a consumer to a topic's
    partitions (then fetching) is READ; a consumer group is READ on the group; asking for a
    topic's partitions or metadata is DESCRIBE; and every topic ``ensure_topics`` wants is
    DESCRIBE too -- it creates what it cannot see, and only admin may create."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.partitions = dict(topics)
        self.records: dict[tuple[str, int], list[Any]] = {(t, p): [] for t, n in topics.items() for p in range(n)}
        self.uses: set[Use] = set()

    def use(self, settings: KafkaSettings, op: str, kind: str, name: str) -> None:
        self.uses.add((settings.sasl_plain_username or "", op, kind, name))

    def connect(self, what: str, settings: KafkaSettings, factory: Any, **kw: Any) -> Any:
        if kw.get("group_id") is not None:
            self.use(settings, "READ", "GROUP", str(kw["group_id"]))
        return {"admin": _RecAdmin, "producer": _RecProducer, "consumer": _RecConsumer}[what](self, settings)


class _RecAdmin:
    def __init__(self, cluster: _Cluster, settings: KafkaSettings) -> None:
        self.cluster, self.settings = cluster, settings

    def list_topics(self) -> list[str]:
        return []  # so ensure_topics names every topic it wants in create_topics

    def create_topics(self, new: list[Any]) -> None:
        for t in new:
            self.cluster.use(self.settings, "DESCRIBE", "TOPIC", t.name)

    def describe_topics(self, topics: list[str]) -> list[dict[str, Any]]:
        for t in topics:
            self.cluster.use(self.settings, "DESCRIBE", "TOPIC", t)
        return [{"name": t, "error_code": 0 if t in self.cluster.partitions else 3, "topic_id": f"id-{t}"}
                for t in topics]

    def close(self) -> None:
        pass


class _Sent:
    def __init__(self, metadata: Any) -> None:
        self.metadata = metadata

    def add_callback(self, fn: Any, *args: Any) -> _Sent:
        fn(*args, self.metadata)
        return self

    def add_errback(self, fn: Any, *args: Any) -> _Sent:
        return self

    def get(self, timeout: float | None = None) -> Any:
        return self.metadata


class _RecProducer:
    def __init__(self, cluster: _Cluster, settings: KafkaSettings) -> None:
        self.cluster, self.settings = cluster, settings

    def partitions_for(self, topic: str) -> set[int] | None:
        self.cluster.use(self.settings, "DESCRIBE", "TOPIC", topic)
        n = self.cluster.partitions.get(topic)
        return set(range(n)) if n else None

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int | None = None,
             headers: Any = None) -> _Sent:
        self.cluster.use(self.settings, "WRITE", "TOPIC", topic)
        log = self.cluster.records[(topic, partition or 0)]
        log.append(SimpleNamespace(topic=topic, partition=partition or 0, offset=len(log), key=key, value=value))
        return _Sent(log[-1])

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


class _RecBulk:
    """A stand-in for :class:`producers.bulk.BulkProducer` (librdkafka, the device reports):
    each record sent is a WRITE on its topic, delivered at once."""

    def __init__(self, cluster: _Cluster, settings: KafkaSettings, topic: str, delivered: Any) -> None:
        self.cluster, self.settings, self.topic, self.delivered = cluster, settings, topic, delivered
        self.pending = 0

    def produce(self, values: list[bytes], keys: bytes, key_size: int, headers: Any, stopped: Any, full: Any,
                partitions: Any = None) -> int:
        self.cluster.use(self.settings, "WRITE", "TOPIC", self.topic)
        log = self.cluster.records[(self.topic, 0)]
        for j, value in enumerate(values):
            log.append(SimpleNamespace(topic=self.topic, partition=0, offset=len(log),
                                       key=keys[j * key_size:(j + 1) * key_size], value=value))
            self.delivered(None, self.topic, 0, len(log) - 1)
        return len(values)

    def flush(self, timeout_s: float) -> int:
        return 0

    def abandon(self) -> None:
        pass


class _RecConsumer:
    def __init__(self, cluster: _Cluster, settings: KafkaSettings) -> None:
        self.cluster, self.settings = cluster, settings
        self.positions: dict[Any, int] = {}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        self.cluster.use(self.settings, "DESCRIBE", "TOPIC", topic)
        n = self.cluster.partitions.get(topic)
        return set(range(n)) if n else None

    def topics(self) -> set[str]:  # a metadata request for all topics: the broker leaves out what one cannot see
        return set(self.cluster.partitions)

    def assign(self, tps: list[Any]) -> None:
        for tp in tps:
            self.cluster.use(self.settings, "READ", "TOPIC", tp.topic)
        self.positions = {tp: len(self.cluster.records[(tp.topic, tp.partition)]) for tp in tps}

    def assignment(self) -> set[Any]:
        return set(self.positions)

    def seek_to_beginning(self, *tps: Any) -> None:
        for tp in tps or list(self.positions):
            self.positions[tp] = 0

    def seek(self, tp: Any, offset: int) -> None:
        self.positions[tp] = offset

    def highwater(self, tp: Any) -> int:
        return len(self.cluster.records[(tp.topic, tp.partition)])

    def position(self, tp: Any) -> int:
        return self.positions[tp]

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, list[Any]]:
        out = {}
        for tp, pos in self.positions.items():
            got = self.cluster.records[(tp.topic, tp.partition)][pos:]
            if got:
                out[tp] = got
                self.positions[tp] = pos + len(got)
        return out

    def __iter__(self) -> Iterator[Any]:
        for records in self.poll().values():
            yield from records

    def close(self) -> None:
        pass


def _closure_objects(fn: Any, seen: set[int] | None = None) -> Iterator[Any]:
    """Every object a function's code reaches through its closure, nested functions followed."""
    seen = set() if seen is None else seen
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        yield value
        if inspect.isfunction(value):
            yield from _closure_objects(value, seen)
        elif inspect.ismethod(value) and id(value.__self__) not in seen:  # a task given as a bound method
            seen.add(id(value.__self__))
            yield value.__self__


def _worker_uses(cluster: _Cluster, ws: WorkerSettings) -> None:
    """What `ptt worker` asks of the broker: its own kafka-python clients run against the
    recorder (ensure_stream_topics, the query cache, the broker guard); the Faust app is read
    off the app `create_app` builds. Faust consumes the topics of its agents, its tables'
    changelogs (recovery) and the leader assignor's topic, in the consumer group of its app
    id; it declares (creates, when its metadata does not list them) its internal channels: the
    changelogs and the leader topic; it writes the changelogs. Its agents, timers and tasks
    send to every Faust topic and every estimates sink their code refers to (their sources
    are given to the decorators, not used in their bodies)."""
    import asyncio

    import faust

    from stream_app.guard import BrokerGuard
    from stream_app.worker.app import QueryCache, StreamWorker, create_app, ensure_stream_topics
    from stream_app.worker.publish import BatchSink

    ensure_stream_topics(ws)
    app = create_app(ws)
    principal = ws.model_copy(update={"sasl_plain_username": app.conf.broker_credentials.username})

    def use(op: str, kind: str, names: Any) -> None:
        for name in names:
            cluster.use(principal, op, kind, name)

    use("READ", "GROUP", [app.conf.id])
    leader = app._leader_assignor._leader_topic.get_topic_name()
    use("READ", "TOPIC", [leader])
    use("CREATE", "TOPIC", [leader])
    for agent in app.agents.values():
        use("READ", "TOPIC", agent.channel.topics)
    for table in app.tables.values():
        for op in ("READ", "WRITE", "CREATE"):
            use(op, "TOPIC", table.changelog_topic.topics)
    def reached(obj: Any) -> None:
        if isinstance(obj, faust.topics.Topic):
            use("WRITE", "TOPIC", obj.topics)
        elif isinstance(obj, BatchSink):
            use("WRITE", "TOPIC", [obj.topic])
        elif isinstance(obj, QueryCache):
            asyncio.run(obj.refresh())
        elif isinstance(obj, BrokerGuard):
            obj.start(lambda reason: None)
            obj.stop()  # after its first check, which runs at once
            assert obj._thread is not None
            obj._thread.join(timeout=10)
        elif isinstance(obj, StreamWorker):
            # the runtime the callbacks hand their input to: its topics count as written where
            # its code sends to them (its sources are the agents' channels), its sinks always
            source = inspect.getsource(StreamWorker)
            for name, attr in vars(obj).items():
                if not isinstance(attr, faust.topics.Topic) or f"self.{name}.send(" in source:
                    reached(attr)

    code = [agent.fun for agent in app.agents.values()] + list(app._app_tasks)
    for fn in code:
        for obj in _closure_objects(fn):
            reached(obj)


def _shuffler_uses(cluster: _Cluster, ss: ShufflerSettings) -> None:
    """What `ptt shuffler` asks of the broker. Its own topic check (ensure_topics of
    shuffler_topics: DESCRIBE) and its query reader (QueryReader: READ the queries) run against
    the recorder; its transactional loop is read off its source (stream_app/shuffler/runtime.py):
    every topic it sends to is WRITE, every topic whose partitions it assigns or whose committed
    offset it keeps (the device topic; the state topic, read back on a restart) is READ, the
    consumer group it commits offsets in (in the transaction) is READ, and its transactional id
    is WRITE (init, add partitions and offsets, commit) and DESCRIBE."""
    import schemas.kafka_io as kafka_io
    import stream_app.shuffler.runtime as runtime

    topics, compacted = runtime.shuffler_topics(ss)
    kafka_io.ensure_topics(ss, topics, compacted=compacted)
    reader = kafka_io.QueryReader(ss)
    reader.catch_up()
    reader.close()
    source = inspect.getsource(runtime.Shuffler)
    assert "QueryReader(s)" in source  # the reader just run is the one it uses

    def field(name: str) -> str:
        value = getattr(ss, name)
        assert isinstance(value, str), name
        return value

    sent = set(re.findall(r"\.send\((?:self\.)?s\.(\w+)", source))
    assert sent == {"reports_topic", "dead_letter_topic", "state_topic"}, sent  # a new output needs an ACL
    for name in sent:
        cluster.use(ss, "WRITE", "TOPIC", field(name))
    if ss.http_port:  # its front door (stream_app/shuffler/front_door.py) writes the verified reports
        import stream_app.shuffler.front_door as front_door

        door = inspect.getsource(front_door.FrontDoor)
        door_sent = set(re.findall(r"\.send\(s\.(\w+)", door))
        assert door_sent == {"device_topic"}, door_sent
        cluster.use(ss, "WRITE", "TOPIC", field("device_topic"))
        assert "ensure_topics(s, {s.device_topic:" in door
    read = set(re.findall(r"TopicPartition\((?:settings|self\.s|s)\.(\w+)", source))
    assert read == {"device_topic", "source_topic", "state_topic"}, read
    for name in read:
        cluster.use(ss, "READ", "TOPIC", field(name))
    (group,) = set(re.findall(r"group_id=s\.(\w+)", source))
    cluster.use(ss, "READ", "GROUP", field(group))
    (txn,) = set(re.findall(r"transactional_id=s\.(\w+)", source))
    for op in ("WRITE", "DESCRIBE"):
        cluster.use(ss, op, "TXN", field(txn))


def _uses_of_the_principals(services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
                            tmp_path: Path) -> set[Use]:
    """Run what each principal runs in the deployment against the recorder; its uses.

    * analyst: the `queries` job (publish-demo-queries.py), the `analyst` service's command
      (`ptt analyst list`), and `ptt subscribe` for the estimates of its queries, as rows and
      as frames kept in Parquet (`--parquet`, the estimate frames topic);
    * subscriber: the `subscriber` service's command (`ptt subscribe`) and `ptt subscribe --parquet`;
    * replay: the `replay` service's `ptt replay` (two epochs, as fast as possible);
    * worker: `ptt worker`, see :func:`_worker_uses`;
    * shuffler: `ptt shuffler`, see :func:`_shuffler_uses`;
    * device: a vehicle sends its own reports: the writes of `ptt replay` without ground truth
      (what it answers reaches it from its gateway, not from Kafka), once directly to the
      reports topic and once through the shuffler (`--via-shuffler`: the device topic)."""
    import producers.replay.plan as replay_plan
    import schemas.kafka_io as kafka_io
    from producers import sink as sink_mod
    from producers.replay import replay

    cluster = _Cluster({name: parts for name, (parts, _) in _topics_the_code_creates(services, monkeypatch).items()})
    for module in (kafka_io, sink_mod, replay_plan):  # stream_app.subscribe imports kafka_io's connect when it connects
        monkeypatch.setattr(module, "connect", cluster.connect)
    monkeypatch.setattr(sink_mod, "BulkProducer", lambda settings, topic, delivered, **kw: _RecBulk(
        cluster, settings, topic, delivered))  # the replay's device reports (librdkafka)

    def run(service: str, command: list[str], **extra: str) -> None:
        _settings_in_env(monkeypatch, {**_env(services[service]), "PTT_DATA_DIR": str(tmp_path / "data"), **extra})
        args = build_parser().parse_args(command)
        assert args.func(args) == 0, (service, command)

    spec = importlib.util.spec_from_file_location("publish_demo_queries", DEMO_QUERIES_SCRIPT)
    assert spec is not None and spec.loader is not None
    demo_queries = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo_queries)
    _settings_in_env(monkeypatch, {**_env(services["queries"]), "PTT_DATA_DIR": str(tmp_path / "data")})
    assert demo_queries.main() == 0
    run("analyst", services["analyst"]["command"][1:])
    run("analyst", ["subscribe", "--idle-timeout", "1"])
    run("subscriber", [*services["subscriber"]["command"][1:], "--idle-timeout", "1"])
    tmp_path.mkdir(parents=True, exist_ok=True)
    for who in ("analyst", "subscriber"):
        run(who, ["subscribe", "--parquet", str(tmp_path / f"{who}.parquet"), "--idle-timeout", "1"])
    before = set(cluster.uses)
    replay(_replay_settings(services, monkeypatch).model_copy(update={
        "max_epochs": 2, "speed": 0.0, "producers": 1, "data_dir": tmp_path / "data"}), progress=False)
    replayed = cluster.uses - before
    assert any(op == "WRITE" and n == KafkaSettings().reports_topic for _, op, _, n in replayed), replayed
    _settings_in_env(monkeypatch, {**_env(services["replay"]), "PTT_SASL_PLAIN_USERNAME": "device"})
    device = ReplaySettings().model_copy(update={"max_epochs": 2, "truth": False, "data_dir": tmp_path / "data"})
    before = set(cluster.uses)
    replay(device, progress=False)
    # the simulated fleet stands in for enrolled devices: it holds the enrollment secret
    replay(device.model_copy(update={"via_shuffler": True, "enrollment_secret": SecretStr(ENROLLMENT_SECRET)}),
           progress=False)
    # a device sends reports; the per-epoch source notes are the replay's (the shuffler's trusted
    # clock: only the replay principal may write them), so that use is the replay's
    notes = ReplaySettings().source_topic
    cluster.uses = before | {u if u[3] != notes else ("replay", *u[1:]) for u in cluster.uses - before
                             if u[1] == "WRITE"}
    assert ("device", "WRITE", "TOPIC", ReplaySettings().device_topic) in cluster.uses
    assert ("replay", "WRITE", "TOPIC", notes) in cluster.uses
    _shuffler_uses(cluster, _shuffler_settings(services, monkeypatch))
    ws = _worker_settings(services, monkeypatch).model_copy(update={"worker_dir": tmp_path / "worker"})
    _worker_uses(cluster, ws)
    return cluster.uses


def _grants(granted: list[Grant], use: Use, same_op: bool = False) -> bool:
    """Does some grant allow ``use``? Kafka's rules: a LITERAL name matches itself, a PREFIXED
    one every name it starts; READ and WRITE imply DESCRIBE (unless ``same_op``)."""
    principal, op, kind, name = use
    return any(p == principal and k == kind and (n == name if pat == "LITERAL" else name.startswith(n))
               and (g_op == op or (not same_op and op == "DESCRIBE" and g_op in ("READ", "WRITE")))
               for p, g_op, k, n, pat in granted)


def _granted(calls: list[list[str]]) -> list[Grant]:
    out = []
    resources = {"--topic": "TOPIC", "--group": "GROUP", "--cluster": "CLUSTER", "--transactional-id": "TXN",
                 "--delegation-token": "TOKEN", "--user-principal": "USER"}
    for args in calls:
        assert "--add" in args and "--remove" not in args
        assert not {"--deny-principal", "--deny-host", "--producer", "--consumer", "--idempotent"} & set(args), args
        assert _flag(args, "--allow-host") in ([], ["*"])
        (principal,) = _flag(args, "--allow-principal")
        assert principal.startswith("User:") and principal != "User:*", args
        kinds = [(resources[a], args[i + 1]) for i, a in enumerate(args) if a in resources]
        assert len(kinds) == 1, args
        (kind, name), = kinds
        assert name and "*" not in name, args
        pattern = (_flag(args, "--resource-pattern-type") or ["literal"])[0].upper()
        ops = _flag(args, "--operation")
        assert ops, args
        out += [(principal.removeprefix("User:"), op.upper(), kind, name, pattern) for op in ops]
    return out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_acls_grant_what_the_code_uses_and_nothing_more(services: dict[str, dict[str, Any]],
                                                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The ACLs against what each principal's code really asks of the broker
    (:func:`_uses_of_the_principals`): every use is granted, every grant is used by its
    principal with that very operation, and no grant reaches a topic of the deployment (or an
    operation on it) its principal does not use, but for the principal's own topics (a prefix
    grant stays inside the worker's internal topics)."""
    env = _job_env(services, "kafka-acls")
    done, calls, config = _run_recorded(tmp_path, ACLS_SCRIPT, "KAFKA_ACLS", env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert config == _admin_properties(env) * len(calls)
    assert all(args[:3] == ["--bootstrap-server", env["BOOTSTRAP"], "--command-config"] for args in calls)
    (props,) = {args[3] for args in calls}  # one temporary properties file, removed at the end
    assert not Path(props).exists()
    granted = _granted(calls)
    assert len(granted) == len(set(granted)), "a grant repeated"

    uses = _uses_of_the_principals(services, monkeypatch, tmp_path / "run")
    assert {u[0] for u in uses} == {"device", "replay", "worker", "analyst", "subscriber", "shuffler"}
    missing = sorted(u for u in uses if not _grants(granted, u))
    assert not missing, f"used but not granted: {missing}"
    unused = sorted(g for g in granted if not any(
        _grants([g], u, same_op=True) for u in uses))
    assert not unused, f"granted but never used: {unused}"
    # what a grant reaches among the deployment's topics: a use of its principal with its
    # operation, or else one of the principal's own topics (used by it alone: a prefix grant
    # may cover the worker's internal topics whole), never a topic it does not use or shares
    topics = set(_topics_the_code_creates(services, monkeypatch))
    users = {t: {p for p, _, kind, n in uses if kind == "TOPIC" and n == t} for t in topics}
    beyond = sorted((g, t) for g in granted if g[2] == "TOPIC" for t in topics
                    if _grants([g], (g[0], g[1], "TOPIC", t), same_op=True)
                    and (g[0], g[1], "TOPIC", t) not in uses and users[t] != {g[0]})
    assert not beyond, f"grants reaching topics, or operations on them, their principal does not use: {beyond}"
    # the deployment's policy (deploy/README.md): only the worker writes estimates; no principal
    # both writes reports and publishes queries; only the worker creates topics, and only under
    # its app id; nobody alters, deletes or touches the cluster
    k, w = KafkaSettings(), WorkerSettings()
    assert {p for p, op, _, n, _ in granted if op == "WRITE" and n == w.estimates_topic} == {"worker"}
    writers = {n: {p for p, op, _, name, _ in granted if op == "WRITE" and name == n}
               for n in (k.reports_topic, k.queries_topic)}
    assert not writers[k.reports_topic] & writers[k.queries_topic], writers
    assert {(p, n, pat) for p, op, _, n, pat in granted if op == "CREATE"} == {("worker", f"{w.app_id}-", "PREFIXED")}
    assert not {op for _, op, _, _, _ in granted} & {"ALL", "ALTER", "DELETE", "ALTER_CONFIGS", "CLUSTER_ACTION",
                                                     "IDEMPOTENT_WRITE", "DESCRIBE_CONFIGS"}
    assert not any(kind == "CLUSTER" for _, _, kind, _, _ in granted)  # no IdempotentWrite: Kafka >= 3.0
    # only the shuffler holds a transactional id, and only its own (<shuffler_id>-<index>)
    ss = ShufflerSettings()
    assert {(p, k, n) for p, _, k, n, _ in granted if k == "TXN"} == {("shuffler", "TXN", f"{ss.shuffler_id}-")}
    # through the shuffler a device needs the device topic only; nobody but the shuffler reads it
    # and the shuffler's front door (the compose file starts it) writes what it verified
    assert {p for p, op, _, n, _ in granted if op == "WRITE" and n == ss.device_topic} == {"device", "shuffler"}
    assert {p for p, op, _, n, _ in granted if op == "READ" and n == ss.device_topic} == {"shuffler"}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_acls_cover_what_each_client_lists_and_uses(services: dict[str, dict[str, Any]], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Every topic a client's ensure_topics lists must be visible to it (DESCRIBE, implied by READ
    and WRITE): an invisible topic would be created, and creation is denied."""
    done, calls, _ = _run_recorded(tmp_path, ACLS_SCRIPT, "KAFKA_ACLS", _job_env(services, "kafka-acls"))
    assert done.returncode == 0, done.stderr
    granted = _granted(calls)

    def visible(principal: str, topic: str) -> bool:
        return any(p == principal and kind == "TOPIC" and op in ("READ", "WRITE", "DESCRIBE")
                   and (n == topic if pat == "LITERAL" else topic.startswith(n)) for p, op, kind, n, pat in granted)

    worker_topics = _topics_the_code_creates(services, monkeypatch, ("worker",))
    assert all(visible("worker", t) for t in worker_topics), worker_topics
    k = KafkaSettings()
    for principal in ("replay", "analyst"):  # ensure_topics(settings): reports, queries, truth
        assert all(visible(principal, t) for t in (k.reports_topic, k.queries_topic, k.truth_topic)), principal
    from stream_app.shuffler.runtime import shuffler_topics

    topics, _ = shuffler_topics(_shuffler_settings(services, monkeypatch))
    assert all(visible("shuffler", t) for t in topics), topics


def test_demo_queries_job_publishes_the_replays_queries_as_the_analyst(services: dict[str, dict[str, Any]],
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    from producers.replay import default_queries, fleet_size_for, load_day

    svc = services["queries"]
    assert svc["command"] == ["python", f"{KAFKA_MOUNT[1]}/{DEMO_QUERIES_SCRIPT.name}"]
    assert KAFKA_MOUNT in _mounts(svc)
    spec = importlib.util.spec_from_file_location("publish_demo_queries", DEMO_QUERIES_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    published: list[Any] = []
    monkeypatch.setattr(module, "read_queries", lambda s: [])
    monkeypatch.setattr(module, "publish_query", lambda s, q: published.append((s, q)))
    _settings_in_env(monkeypatch, {**_env(svc), "PTT_DATA_DIR": str(tmp_path)})
    assert module.main() == 0
    assert {s.sasl_plain_username for s, _ in published} == {"analyst"}
    # the very queries `ptt replay` would have published itself, over the same day
    replay = _replay_settings(services, monkeypatch).model_copy(update={"data_dir": tmp_path})
    day = load_day(replay)
    assert [q for _, q in published] == default_queries(day, fleet_size_for(day, replay), replay.mechanisms)
    # nothing is published when queries exist
    published.clear()
    monkeypatch.setattr(module, "read_queries", lambda s: ["a query"])
    assert module.main() == 0 and published == []


# -- Prometheus --------------------------------------------------------------------------------------

def test_prometheus_scrapes_every_worker_replica(services: dict[str, dict[str, Any]],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _yaml(PROMETHEUS)
    assert cfg["global"]["scrape_interval"] == "5s"
    # the port each scraped service serves /metrics on, from its settings
    ports = {"worker": _worker_settings(services, monkeypatch).web_port,
             "shuffler": _shuffler_settings(services, monkeypatch).metrics_port}
    jobs = cfg["scrape_configs"]
    assert jobs
    hosts = []
    for job in jobs:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        for sd in job.get("dns_sd_configs", []):
            assert sd.get("type", "SRV") == "A"
            for name in sd["names"]:
                assert int(sd["port"]) == ports[name], (job["job_name"], name)
            hosts += sd["names"]
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, tport = target.rpartition(":")
                assert int(tport) == ports[host], target
                hosts.append(host)
    assert hosts and set(hosts) <= set(services), hosts
    assert "worker" in hosts  # the service name: Docker's DNS answers with every replica
    assert "shuffler" in hosts
    names = [job["job_name"] for job in jobs]
    assert len(names) == len(set(names))
    prom = services["prometheus"]
    assert ("./prometheus/prometheus.yml", "/etc/prometheus/prometheus.yml") in _mounts(prom)
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]


def test_promtool_accepts_the_prometheus_config(promtool: str) -> None:
    done = subprocess.run([promtool, "check", "config", str(PROMETHEUS)], capture_output=True, text=True,
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
    estimator_names = set(E.all_estimator_names())
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
                assert matchers["mechanism"] in E.mechanism_names(), where
        for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")):
            assert re.search(rf"\b{label}\b", t["expr"]) or label in TARGET_LABELS, f"legend {label}: {where}"
    # the brief's panels are all there
    assert {"ptt_epoch_reports", "ptt_epoch_lag_epochs", "ptt_late_records_total", "ptt_dead_letters_total",
            "ptt_refused_vehicles_total", "ptt_suppressed_estimates_total", "ptt_epochs_closed_total",
            "ptt_reports_total", "ptt_estimate_vehicles", "ptt_estimate_lower_vehicles",
            "ptt_estimate_upper_vehicles", "ptt_ground_truth_vehicles", "ptt_query_epsilon",
            "ptt_query_crowd_size_vehicles", "ptt_withheld_epochs_total"} <= used


def test_overview_plots_withheld_epochs_by_reason(dashboards: dict[str, dict[str, Any]]) -> None:
    from stream_app.worker.estimate import WITHHELD_CODES

    (panel,) = [p for p in _panels(dashboards["overview.json"]) if p["title"] == "Withheld epochs by reason"]
    assert panel["type"] == "timeseries"
    assert [t["expr"] for t in panel["targets"]] == [
        "sum by (query, reason) (increase(ptt_withheld_epochs_total[5m]))"]
    assert _exposed()["ptt_withheld_epochs_total"] == {"query", "reason"}
    for reason in WITHHELD_CODES:  # the description names every reason the worker counts
        assert reason in panel["description"], reason


def test_station_dashboard_has_a_panel_per_mechanism_with_bands_and_truth(
        dashboards: dict[str, dict[str, Any]]) -> None:
    board = dashboards["station.json"]
    wanted = {m: {E.get_spec(m).headline} for m in E.default_query_mechanisms()}  # today alp and unary
    assert wanted and "sp" not in wanted
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
    assert "ptt_query_epsilon_shuffled{" in stat_exprs  # next to the local epsilon
    assert "max by (release) (ptt_vehicle_day_epsilon)" in stat_exprs  # a vehicle's whole day, by its release
    assert 'statistic="mean"' in stat_exprs and 'statistic="p01"' in stat_exprs


def test_station_dashboard_follows_the_registry(dashboards: dict[str, dict[str, Any]]) -> None:
    """One estimate panel per mechanism the registry runs as a default query (and none for
    another), titled with the spec's title and headline, plotting the headline's bands and the
    spec's overlay estimator; the crowd-size panel plots each spec's extra statistics."""
    panels = list(_panels(dashboards["station.json"]))
    selected: dict[str, list[dict[str, Any]]] = {}
    for p in panels:
        names = {m for t in p["targets"] for m in re.findall(r'mechanism="([^"]+)"', t["expr"])}
        assert len(names) <= 1, p["title"]
        for name in names:
            selected.setdefault(name, []).append(p)
    assert list(selected) == list(E.default_query_mechanisms())
    for name, (panel,) in selected.items():
        spec = E.get_spec(name)
        assert panel["title"].startswith(f"{spec.title} ({spec.headline}"), panel["title"]
        estimators = {m for t in panel["targets"] for m in re.findall(r'estimator="([^"]+)"', t["expr"])}
        assert estimators == {spec.headline} | ({spec.overlay[0]} if spec.overlay else set()), (name, estimators)
        if spec.overlay:
            assert f"{spec.overlay[1]} dotted" in panel["title"]
    crowds = [p for p in panels if any("ptt_query_crowd_size_vehicles" in t["expr"] for t in p["targets"])]
    with_extras = [E.get_spec(n) for n in E.default_query_mechanisms() if E.get_spec(n).extra_names]
    assert [p["title"] for p in crowds] == [f"{spec.title} crowd size" for spec in with_extras] != []
    for panel, spec in zip(crowds, with_extras, strict=True):
        stats = [m for t in panel["targets"] for m in re.findall(r'statistic="([^"]+)"', t["expr"])]
        assert stats == list(spec.extra_names)


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
    assert set(station) == {"station", "query", "span"}
    assert station["span"]["query"] == "label_values(ptt_rollup_vehicles, span_s)"
    # a flows panel per span: repeated over every span the workers publish (all selected by default)
    assert station["span"]["multi"] and station["span"]["includeAll"]
    (flows,) = [p for p in _panels(dashboards["station.json"]) if p.get("repeat") == "span"]
    assert flows["title"].startswith("Flows over $span s") and all(
        'span_s=~"$span"' in t["expr"] for t in flows["targets"])
