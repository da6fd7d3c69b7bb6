"""The statistics core's public surface and its purity.

``estimators`` is pure numpy/scipy: it must not import the streaming stack (Kafka, Faust
and its ``mode`` runtime, aiokafka, Prometheus) nor pydantic -- checked twice, statically
(every import statement of every source file, via ``ast``) and dynamically (a fresh
interpreter imports the package and every submodule, then ``sys.modules`` is inspected).

Surface: every name in ``estimators.__all__`` exists, ``__all__`` has no duplicates,
``from estimators import *`` binds exactly ``__all__``, and every public function or class
in a submodule's own ``__all__`` is re-exported by the package (the same object).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import estimators

FORBIDDEN = {"kafka", "faust", "aiokafka", "prometheus_client", "pydantic", "mode"}
# the core's declared dependencies (pyproject.toml) besides the standard library
ALLOWED_THIRD_PARTY = {"numpy", "scipy"}

PKG_DIR = Path(estimators.__file__).resolve().parent
SOURCES = sorted(PKG_DIR.rglob("*.py"))


def _submodules() -> list[ModuleType]:
    return [importlib.import_module(f"estimators.{info.name}")
            for info in pkgutil.iter_modules(estimators.__path__) if not info.name.startswith("_")]


def _absolute_imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports in one source file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _dynamic_imports(tree: ast.AST) -> list[str]:
    """Calls like importlib.import_module("x") / __import__("x") with a literal name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append(node.args[0].value.split(".")[0])
    return found


def test_sources_found() -> None:
    names = {p.name for p in SOURCES}
    assert {"__init__.py", "mechanisms.py", "privacy.py", "linear.py"} <= names


def test_no_forbidden_imports_in_the_source() -> None:
    offenders = {}
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bad = (_absolute_imports(path) | set(_dynamic_imports(tree))) & FORBIDDEN
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_only_stdlib_numpy_and_scipy_are_imported() -> None:
    allowed = set(sys.stdlib_module_names) | ALLOWED_THIRD_PARTY | {"estimators", "__future__"}
    offenders = {p.name: sorted(_absolute_imports(p) - allowed) for p in SOURCES}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_relative_import_leaves_the_package() -> None:
    for path in SOURCES:
        depth = len(path.relative_to(PKG_DIR).parts)  # 1 for a module directly in the package
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level <= depth, f"{path.name}: relative import above the package"


def test_importing_the_package_loads_no_forbidden_module() -> None:
    subs = [info.name for info in pkgutil.iter_modules(estimators.__path__)]
    code = (
        "import importlib, json, sys\n"
        "import estimators\n"
        f"for name in {subs!r}:\n"
        "    importlib.import_module('estimators.' + name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(PKG_DIR.parent), timeout=120)
    loaded = {name.split(".")[0] for name in json.loads(out.stdout)}
    assert "estimators" in loaded and "numpy" in loaded
    assert loaded & FORBIDDEN == set()


def test_the_command_line_starts_without_scipy() -> None:
    """scipy is imported inside the estimators' functions that use it, so building ``ptt``'s
    parser (every command's module imported) does not load it: ~1 s of CPU off every start."""
    code = ("import json, sys\nfrom stream_app.cli import build_parser\nbuild_parser()\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(PKG_DIR.parent), timeout=120)
    loaded = {name.split(".")[0] for name in json.loads(out.stdout)}
    assert "estimators" in loaded and "stream_app" in loaded
    assert "scipy" not in loaded


def test_all_names_exist_and_are_unique() -> None:
    names = estimators.__all__
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    missing = [n for n in names if not hasattr(estimators, n)]
    assert missing == []
    assert all(isinstance(n, str) for n in names)


def test_star_import_binds_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from estimators import *", namespace)  # noqa: S102 - a literal, the point of the test
    namespace.pop("__builtins__", None)
    assert set(namespace) == set(estimators.__all__)
    for name, obj in namespace.items():
        assert obj is getattr(estimators, name)


def test_submodule_all_lists_are_valid_and_unique() -> None:
    for mod in _submodules():
        names = getattr(mod, "__all__", None)
        assert names is not None, f"{mod.__name__} has no __all__"
        assert len(names) == len(set(names)), f"{mod.__name__}: duplicate names in __all__"
        missing = [n for n in names if not hasattr(mod, n)]
        assert missing == [], f"{mod.__name__}: __all__ names missing: {missing}"


def test_submodules_public_functions_and_classes_are_re_exported() -> None:
    not_exported: dict[str, list[str]] = {}
    for mod in _submodules():
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if getattr(estimators, name, None) is not obj or name not in estimators.__all__:
                not_exported.setdefault(mod.__name__, []).append(name)
    assert not_exported == {}


def test_public_functions_and_classes_of_the_submodules_are_listed_in_their_all() -> None:
    unlisted: dict[str, list[str]] = {}
    for mod in _submodules():
        for name, obj in vars(mod).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if obj.__module__ == mod.__name__ and name not in getattr(mod, "__all__", []):
                unlisted.setdefault(mod.__name__, []).append(name)
    assert unlisted == {}
