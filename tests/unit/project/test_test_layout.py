"""The tests' own layout (docs/layout.md): unit tests live in ``tests/unit/<package>/`` or
``tests/unit/project/``, are named after a module of that package, and import no private name
(one starting with ``_``) of the project's packages -- they test the public seams."""

from __future__ import annotations

import ast

from tests.paths import ROOT

PACKAGES = ("estimators", "schemas", "producers", "stream_app")
UNIT = ROOT / "tests" / "unit"


def _test_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py"))


def test_no_test_imports_a_private_name() -> None:
    bad = []
    for rel in _test_files():
        tree = ast.parse((ROOT / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                bad += [f"{rel}: from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
    assert not bad, "\n".join(bad)


def test_unit_tests_mirror_the_modules() -> None:
    """Every unit test file is tests/unit/<package path>/test_<module>[_<aspect>].py for a module
    that exists there, or under tests/unit/project/."""
    stray = []
    for path in UNIT.rglob("test_*.py"):
        rel = path.relative_to(UNIT)
        if rel.parts[0] == "project":
            continue
        package = ROOT.joinpath(*rel.parts[:-1])
        modules = {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir() if p.is_dir()}
        stem = path.stem.removeprefix("test_")
        if not package.is_dir() or not any(stem == m or stem.startswith(m + "_") for m in modules):
            stray.append(str(rel))
    assert not stray, f"unit tests not named after a module of their package: {stray}"
