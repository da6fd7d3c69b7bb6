"""Every module's tests can be found: by a test file named for it (``test_NAME.py``,
``test_NAME_*.py``, or the file named for its package), or by its line in tests/INDEX.md. A
module with neither fails, and so does an index line for a module that is gone or has a named
test file now, or one that names a test file that does not exist.

Deliberate breakage: deleting ``producers/counters.py``'s line from the index fails the first
test; renaming ``tests/integration/test_crash.py`` in it fails the second."""

from __future__ import annotations

import re
from pathlib import Path

from tests.paths import ROOT

PACKAGES = ("estimators", "producers", "stream_app", "schemas")
INDEX = ROOT / "tests" / "INDEX.md"
ROW = re.compile(r"^\| `(?P<module>[\w/]+\.py)` \| (?P<where>.+) \|$")


def _modules() -> list[Path]:
    return sorted(p.relative_to(ROOT) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
                  if p.stem not in ("__init__", "__main__"))


def _named(module: Path, tests: set[str]) -> bool:
    name, package = module.stem, module.parent.name
    return any(t == f"test_{name}" or t.startswith(f"test_{name}_") or t == f"test_{package}" for t in tests)


def _index() -> dict[str, str]:
    rows = [ROW.match(line) for line in INDEX.read_text().splitlines() if line.startswith("| `")]
    assert all(rows), "an index line this test does not read"
    return {m["module"]: m["where"] for m in rows if m is not None}


def test_every_module_has_a_named_test_file_or_an_index_line() -> None:
    tests = {p.stem for p in (ROOT / "tests").rglob("test_*.py")}
    unnamed = {str(m) for m in _modules() if not _named(m, tests)}
    index = _index()
    assert not unnamed - index.keys(), f"modules without a test file named for them or a line in {INDEX}"
    assert not index.keys() - unnamed, f"{INDEX} lines for modules that are gone or have a named test file now"


def test_every_test_file_the_index_names_exists() -> None:
    named = {f for where in _index().values() for f in re.findall(r"`(tests/[\w/]+\.py)`", where)}
    assert named and not {f for f in named if not (ROOT / f).is_file()}
