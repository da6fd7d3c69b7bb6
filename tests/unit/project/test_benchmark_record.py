"""The benchmark record (tests/benchmarks/record.py): a run appends one JSON object with the
command, the machine, the date, its exit code and every JSON line the benchmark printed; the
committed record parses, every entry says where its figures came from, and its figures are JSON objects (fields)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.benchmarks import record
from tests.paths import ROOT


def test_a_run_appends_its_figures_command_and_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "bench_tiny.py"
    script.write_text('import json, sys\nprint(json.dumps({"what": "x", "per_s": 12.5}))\nprint("a note")\n'
                      'print(json.dumps({"what": "y", "args": sys.argv[1:]}))\n')
    out = tmp_path / "record.jsonl"
    out.write_text('{"bench": "earlier"}\n')
    assert record.run([str(script), "--fast"], out) == 0
    lines = out.read_text().splitlines()
    assert json.loads(lines[0]) == {"bench": "earlier"}  # appended, never rewritten
    entry = json.loads(lines[1])
    assert entry["bench"] == "bench_tiny" and entry["exit_code"] == 0
    assert entry["command"].endswith("bench_tiny.py --fast")
    assert entry["figures"] == [{"what": "x", "per_s": 12.5}, {"what": "y", "args": ["--fast"]}]
    assert entry["notes"] == ["a note"]
    assert entry["machine"]["cores"] >= 1 and "load_1m_start" in entry["machine"] and entry["date"]
    assert '"per_s": 12.5' in capsys.readouterr().out  # the benchmark's output is still shown


def test_a_failing_benchmark_is_recorded_with_its_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "bench_fails.py"
    script.write_text("import sys\nsys.exit(3)\n")
    out = tmp_path / "record.jsonl"
    assert record.run([str(script)], out) == 3
    assert json.loads(out.read_text())["exit_code"] == 3


def test_the_committed_record_parses_and_names_its_source() -> None:
    assert record.RECORD == ROOT / "tests" / "benchmarks" / "record.jsonl"  # beside the recorder, not in docs/
    entries = [json.loads(line) for line in record.RECORD.read_text().splitlines()]
    assert entries
    for e in entries:
        assert {"bench", "command", "date", "figures"} <= set(e), e.get("bench")
        assert "machine" in e or "source" in e, e["bench"]  # measured by the recorder, or transcribed (said so)
        assert all(isinstance(f, dict) for f in e["figures"]), e["bench"]  # figures are fields, not text rows


def test_the_recorder_refuses_what_is_not_a_script() -> None:
    argv = sys.argv
    try:
        sys.argv = ["record.py"]
        assert record.main() == 2
    finally:
        sys.argv = argv
