"""docs/operations.md ("Benchmarks") lists every benchmark script of tests/benchmarks/ (``bench_*.py``)
with what it measures and its command, the script's docstring's ``Run:`` line: a script added
without its row, a row left for a script that is gone, or a command that no longer matches its
docstring fails here.

Deliberate breakage: deleting ``bench_flows.py``'s row fails the first test; changing its
``--seeds 4`` to ``--seeds 5`` in the table (or in the script's docstring alone) fails the second."""

from __future__ import annotations

import ast
import re

from tests.paths import ROOT

BENCHMARKS = ROOT / "tests" / "benchmarks"
ROW = re.compile(r"^\| `(bench_\w+\.py)` \| (.+) \| `(.+)` \|$")


def _listed() -> dict[str, str]:
    """The Benchmarks section's rows: script -> its command (a cell's ``\\|`` read as ``|``)."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Benchmarks\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        if m := ROW.match(line):
            assert m.group(1) not in rows, f"{m.group(1)} listed twice"
            rows[m.group(1)] = m.group(3).replace("\\|", "|")
    return rows


def _run_line(script: str) -> str:
    doc = ast.get_docstring(ast.parse((BENCHMARKS / script).read_text())) or ""
    m = re.search(r"Run: ``(.+?)``", doc, re.S)
    assert m, f"{script}'s docstring has no Run: ``...`` line"
    return " ".join(m.group(1).split())


def test_every_benchmark_script_is_listed_and_nothing_else() -> None:
    scripts = sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))
    assert len(scripts) >= 21
    assert sorted(_listed()) == scripts


def test_each_listed_command_is_its_scripts_run_line() -> None:
    listed = _listed()
    wrong = {s: (cmd, _run_line(s)) for s, cmd in listed.items() if cmd != _run_line(s)}
    assert not wrong, wrong
    assert all(f"tests/benchmarks/{s} " in cmd + " " for s, cmd in listed.items())
