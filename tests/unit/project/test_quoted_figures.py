"""Every privacy figure README.md and docs/*.md quote from a command is what that command prints now.

The docs mark what they quote, invisibly in the rendered page:

* ``<!-- figures NAME: ptt plan ... -->`` names a command (run here with ``--json``);
* a quoted number followed by ``<!--NAME.key-->`` (``key`` a dotted path into the JSON, e.g.
  ``queries.alp.epsilon_shuffled`` or ``queries.unary@3600.sd``; where the JSON is a list, as
  ``ptt plan compare``'s, a part names the element by its ``mechanism``: ``oue.sd``) is checked
  against that command's output, at the precision
  it is quoted with (``0.00436``: three significant digits; ``2,427`` or ``26``: the nearest
  integer; ``1.159e+04``: four significant digits). ``none`` is checked to be JSON null.

Any difference fails, and so does a marker naming no command, a command that fails, a doc
with a ``figures`` command but no marked figure, a name given two commands in one doc, or a
``<!--NAME.key-->`` this test would not read (the key's characters, or no number before it):
such a marker would otherwise check nothing. The quickstart's demo output block is checked
line by line against the lines the demo prints (its ``privacy`` lines: every default query, the
direct path), since a code block cannot hold markers.

Deliberate breakage: changing a marked figure in README.md (0.00436 -> 0.00437, **26** -> **27**)
fails this test, as does a marker on a figure of another command's key. With the key's characters
as they were (no ``@``), ``<!--flows.queries.unary@3600.sd-->`` was silently not read; the check for
markers this test does not read fails on that. So do docs/statistics.md's ``ptt plan fleet``
figures (2.393 -> 2.394 for ``fleet.epsilon_day_vehicle``: "quotes 2.394 ... it prints 2.39263...").

Each command runs once (cached per process), in this process. Commands over the same crowd and
stations (``--population``, ``--stations``) are one pytest-xdist group, so they run on one worker
and share the accounting's caches (the ALP station PLD at 3,220 stations and 47,719 devices is
computed once for every command that needs it); the demo's crowd (120,000 devices at 16 stations)
is another group, on whichever worker is free. A ``--day-budget`` search chooses the same in any
process whatever ran before it (its brackets are its planning run's own,
``estimators.fit.History``), so every command runs in-process.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shlex
from collections.abc import Callable
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from stream_app.cli import main
from tests.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"<!-- figures (?P<name>[\w-]+): (?P<command>ptt [^>]*?) -->")
FIGURE = re.compile(r"(?P<value>none|[0-9][0-9,]*(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)(?:\*\*|`)?"
                    r"<!--(?P<name>[\w-]+)\.(?P<key>[\w.@/]+)-->")
MARKER = re.compile(r"<!--[\w-]+\.[^>]*?-->")  # anything shaped like a figure marker


@cache
def _output(command: str) -> Any:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(shlex.split(command)[1:] + ["--json"])
    assert code == 0, f"{command!r} exited with {code}"
    return json.loads(out.getvalue())


@pytest.fixture
def run() -> Callable[[str], Any]:
    """The command's JSON, each command run once per process (:func:`_output` is cached)."""
    return _output


def lookup(obj: Any, key: str) -> Any:
    """The value at the dotted ``key``; in a list, the element whose ``mechanism`` is the part.

    >>> lookup({"queries": {"unary@3600": {"sd": 83.8}}}, "queries.unary@3600.sd")
    83.8
    >>> lookup([{"mechanism": "sp", "sd": 401.3}, {"mechanism": "oue", "sd": 378.5}], "oue.sd")
    378.5
    """
    value: Any = obj
    for part in key.split("."):
        if isinstance(value, list):
            named = [v for v in value if isinstance(v, dict) and v.get("mechanism") == part]
            assert len(named) == 1, f"{len(named)} elements with mechanism {part!r} in the list"
            value = named[0]
        else:
            value = value[part]
    return value


def matches(quoted: str, actual: float | None) -> bool:
    """``quoted`` (as written in the doc) is ``actual`` at the precision it is written with.

    >>> matches("0.00436", 0.0043617), matches("0.00437", 0.0043617), matches("2,427", 2426.89)
    (True, False, True)
    >>> matches("26", 25.906), matches("1.159e+04", 11593.1), matches("none", None), matches("2.47", 2.4721)
    (True, True, True, True)
    """
    if quoted == "none":
        return actual is None
    if actual is None or not math.isfinite(actual):
        return False
    text = quoted.replace(",", "")
    written = Decimal(text)
    if "e" in text or "." in text:
        mantissa = text.split("e")[0].lstrip("0").replace(".", "").lstrip("0")
        digits = len(mantissa)
        exponent = math.floor(math.log10(abs(actual))) if actual else 0
        rounded = round(actual, digits - 1 - exponent)
        return math.isclose(rounded, float(written), rel_tol=1e-9, abs_tol=1e-15)
    return round(actual) == int(written)


def _marked(path: Path) -> tuple[dict[str, str], list[tuple[str, str, str, int]]]:
    text = path.read_text()
    commands: dict[str, str] = {}
    for m in COMMAND.finditer(text):
        assert commands.setdefault(m["name"], m["command"]) == m["command"], \
            f"{path.name}: figures {m['name']} names two commands"
    figures = [(m["value"], m["name"], m["key"], text.count("\n", 0, m.start()) + 1) for m in FIGURE.finditer(text)]
    return commands, figures


QUOTED = [(p, *f) for p in DOCS for f in _marked(p)[1]]


def _crowd(command: str) -> str:
    """A command's pytest-xdist group (``make test`` runs ``--dist loadgroup``): its crowd and stations.

    >>> _crowd("ptt plan alp --population 47719 --expected-yes 100 --stations 3220")
    'quoted-figures-47719-3220'
    """
    argv = shlex.split(command)
    given = {flag: argv[argv.index(flag) + 1] for flag in ("--population", "--stations") if flag in argv}
    return f"quoted-figures-{given.get('--population', '')}-{given.get('--stations', '')}"


def _groups() -> dict[str, str]:
    """Each quoted command's group (a command quoted in two docs still runs once)."""
    return {command: _crowd(command) for path in DOCS for command in _marked(path)[0].values()}


GROUPS = _groups()
COMMANDS = {p: _marked(p)[0] for p in DOCS}


def _group(path: Path, name: str) -> str:
    """The group of the figures ``name`` marks in ``path``."""
    return GROUPS.get(COMMANDS[path].get(name, ""), "quoted-figures--")


def test_the_docs_quote_figures_and_every_command_has_one() -> None:
    assert any(p.name == "README.md" for p, *_ in QUOTED) and any(p.name == "statistics.md" for p, *_ in QUOTED)
    for path in DOCS:
        commands, figures = _marked(path)
        unused = set(commands) - {name for _, name, _, _ in figures}
        assert not unused, f"{path.name}: commands with no marked figure: {sorted(unused)}"
        unknown = {name for _, name, _, _ in figures} - set(commands)
        assert not unknown, f"{path.name}: figures naming no command: {sorted(unknown)}"
        text = path.read_text()
        read = {m.end() for m in FIGURE.finditer(text)}
        unread = [f"line {text.count(chr(10), 0, m.start()) + 1}: {m[0]}" for m in MARKER.finditer(text)
                  if m.end() not in read]
        assert not unread, f"{path.name}: markers this test does not read (no number before them?): {unread}"


@pytest.mark.slow
@pytest.mark.parametrize(("path", "quoted", "name", "key", "line"),
                         [pytest.param(*q, marks=pytest.mark.xdist_group(_group(q[0], q[2]))) for q in QUOTED],
                         ids=[f"{p.name}:{line}:{name}.{key}" for p, _, name, key, line in QUOTED])
def test_a_quoted_figure_is_what_its_command_prints(run: Callable[[str], Any], path: Path, quoted: str, name: str,
                                                     key: str, line: int) -> None:
    command = _marked(path)[0][name]
    actual = lookup(run(command), key)
    assert matches(quoted, actual), f"{path.name}:{line} quotes {quoted} for {key} of `{command}`; it prints {actual}"


@pytest.mark.slow
@pytest.mark.xdist_group(_group(ROOT / "README.md", "demo"))  # where the demo plan runs for its figures
def test_the_quickstart_shows_the_privacy_lines_the_demo_prints(run: Callable[[str], Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's banner gives the day the demo prints: its queries at the parameters of the
    README's ``demo`` plan (``ptt plan fleet ... --day-budget 1``, run once by this module; the
    demo plans the same, :func:`producers.queries.planned_day_params`), through the shuffler."""
    import producers.queries
    from estimators import plain_words, round_down_2sig
    from producers.replay import default_fleet, default_queries, load_day
    from producers.settings import ReplaySettings
    from stream_app.cli.demo_settings import DemoSettings, demo_query_mechanisms
    from stream_app.day_figure import vehicle_day

    readme = (ROOT / "README.md").read_text()
    (command,) = [m["command"] for m in COMMAND.finditer(readme) if m["name"] == "demo"]
    plan = run(command)
    monkeypatch.setattr(producers.queries, "planned_day_params",
                        lambda *args: {k: q["params"] for k, q in plan["queries"].items()})
    demo = DemoSettings()
    rs = ReplaySettings(query_mechanisms=demo_query_mechanisms(demo.fleet_model), fleet_model=demo.fleet_model)
    day = load_day(rs)
    fleet = default_fleet(day, rs)
    assert f"--population {round_down_2sig(fleet)} " in command  # the demo's crowd, as the worker rounds it
    queries = default_queries(day, fleet, rs.mechanisms, rs.flow_day_budget, demo.day_budget)
    line, epsilon_day = vehicle_day(queries, "aggregate")
    block = readme[readme.index("```\nbroker "):]
    block = block[:block.index("```", 4)]
    shown = [ln for ln in block.splitlines() if ln.startswith("privacy ")]
    assert shown == [f"privacy     {line}"]
    assert f"            {plain_words(epsilon_day)}" in block.splitlines()


@pytest.mark.slow
@pytest.mark.xdist_group(_group(ROOT / "README.md", "demo"))  # the README's demo plan is the shipped one
def test_each_shipped_plan_is_what_the_planner_chooses_now(run: Callable[[str], Any]) -> None:
    """producers/plans.json (a first demo's plan, so it need not plan for minutes) holds, per
    setting, the parameters ``ptt plan fleet --day-budget`` chooses for it, as
    the demo would (:func:`producers.queries.planned_day_params`)."""
    from producers.queries import SHIPPED_PLANS

    for plan in json.loads(SHIPPED_PLANS.read_text()):
        mechanisms, population, stations, budget = plan["key"]
        command = (f"ptt plan fleet --population {population} --expected-yes {min(population, 100)} --stations "
                   f"{stations} --query-mechanisms {mechanisms} --day-budget {budget:g}")
        chosen = {k: q["params"] for k, q in run(command)["queries"].items()}
        assert chosen.keys() == plan["params"].keys(), command
        for label, params in chosen.items():
            assert params.keys() == plan["params"][label].keys(), (command, label)
            # 1e-6: a parameter is the root of a day composed by FFT, whose last bits differ between
            # CPUs (pocketfft's SIMD path; 2.5e-9 relative seen between two machines of this kind); a
            # change of the planner moves it by far more
            assert all(math.isclose(v, plan["params"][label][p], rel_tol=1e-6) for p, v in params.items()), (
                f"{command}: the planner chooses {params} for {label}, producers/plans.json ships "
                f"{plan['params'][label]}; ship what it chooses now")


def test_the_readme_says_in_plain_words_what_a_day_figure_means() -> None:
    """The one sentence (estimators.plain_words), as it is, once."""
    from estimators import plain_words

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert readme.count(plain_words()) == 1
