"""The house's size limits (docs/layout.md): no module of the four packages is longer than
600 lines, and no function of the worker's runtime (``stream_app/app.py``: read, call the pure
parts, write, emit) is longer than 40."""

from __future__ import annotations

import ast

from tests.paths import ROOT

PACKAGES = ("estimators", "schemas", "producers", "stream_app")
MAX_MODULE_LINES = 600
MAX_APP_FUNCTION_LINES = 40


def test_no_module_is_longer_than_600_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_of_the_worker_runtime_is_longer_than_40_lines() -> None:
    tree = ast.parse((ROOT / "stream_app" / "app.py").read_text())
    long = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno is not None
            and n.end_lineno - n.lineno + 1 > MAX_APP_FUNCTION_LINES}
    assert not long, f"functions of stream_app/app.py over {MAX_APP_FUNCTION_LINES} lines: {long}"


def test_no_file_keeps_a_merge_conflict_marker() -> None:
    """A merge resolved in one file and not another once committed README.md with its markers."""
    import re
    import subprocess

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,  # noqa: S607
                           check=True).stdout.split()
    marker = re.compile(r"^(<{7} |={7}$|>{7} )", re.M)
    bad = [f for f in files if (ROOT / f).is_file() and (ROOT / f).suffix in {".py", ".md", ".toml", ".yml", ".yaml",
                                                                             ".json", ".sh", ".txt", ""}
           and marker.search((ROOT / f).read_text(errors="replace"))]
    assert bad == []
