"""The project's module import graph, read from the source with ``ast``: no import cycle among
the modules of ``estimators``, ``schemas``, ``producers`` and ``stream_app``, and only the
command line (``stream_app/cli/``, the composition root) imports ``producers``.

Edges are the import statements a module executes, lazy ones inside functions included
(a cycle through them still bites when the function runs); imports under ``if
TYPE_CHECKING:`` never run and are left out. ``import a.b`` and ``from a.b import x`` are an
edge to ``a.b``; ``from a import b`` is an edge to ``a`` (the name is read from the package's
namespace, its ``__init__``) and, when ``a.b`` is a module, to ``a.b``. The implicit import
of a parent package that Python does before any submodule is not an edge (else every
``__init__`` that re-exports its submodules would be a cycle).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from tests.paths import ROOT

PACKAGES = ("estimators", "schemas", "producers", "stream_app")
COMPOSITION_ROOT = "stream_app.cli"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def _imports(module: str, path: Path, type_checking: bool = False) -> set[str]:
    """The project modules ``module`` imports (see the module docstring for what counts; with
    ``type_checking``, the imports under ``if TYPE_CHECKING:`` too, as mypy reads them)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skipped = set() if type_checking else _type_checking_only(tree)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in MODULES}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target in MODULES:
                found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in MODULES}
    found.discard(module)
    return found


@cache
def _graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(the import graph, the type checker's), built when a test first asks: parsing every module
    at import time cost each pytest-xdist worker ~1.5 s of its collection."""
    return ({module: _imports(module, path) for module, path in MODULES.items()},
            {module: _imports(module, path, type_checking=True) for module, path in MODULES.items()})


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_graph_is_read() -> None:
    """The graph holds edges it must hold: a reader that found nothing would pass the rest."""
    graph = _graphs()[0]
    assert {"stream_app.worker.app", "stream_app.cli", "stream_app.cli.errors", "producers.replay"} <= set(MODULES)
    assert "stream_app.guard" in graph["stream_app.worker.app"]  # from ..guard import ...
    assert "producers.replay" in graph["stream_app.cli.replay"]  # lazy, inside run()
    assert "stream_app.worker.app" in graph["stream_app.cli.worker"]  # from ..worker.app import run_worker
    assert {"stream_app.cli.worker", "stream_app.cli.demo"} <= graph["stream_app.cli"]  # from . import ...
    assert "estimators.registry" in graph["schemas.query"]
    assert "schemas.connection" in graph["schemas.settings"]  # KafkaSettings.client_kwargs


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    assert _cycles(_graphs()[0]) == []


def test_no_import_cycle_for_the_type_checker() -> None:
    """Not even through ``if TYPE_CHECKING:`` imports: schemas.connection reads its settings
    through a protocol (ConnectionFields), not by importing schemas.settings, which imports it."""
    assert _cycles(_graphs()[1]) == []


def test_only_the_command_line_imports_producers() -> None:
    outside = {module: sorted(d for d in deps if d.split(".")[0] == "producers")
               for module, deps in _graphs()[0].items()
               if module.split(".")[0] != "producers"
               and module != COMPOSITION_ROOT and not module.startswith(COMPOSITION_ROOT + ".")}
    assert {m: deps for m, deps in outside.items() if deps} == {}


# The path a report takes (docs/layout.md): devices (producers) -> shuffler -> worker -> outputs
# (ptt subscribe, ptt report); stream_app's top keeps what is no one tier's own.
SHUFFLER, WORKER = "stream_app.shuffler", "stream_app.worker"
OUTPUTS = ("stream_app.subscribe", "stream_app.subscribe_flows", "stream_app.report")
TIERS = (SHUFFLER, WORKER, *OUTPUTS, COMPOSITION_ROOT)


def _in(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _edges(source: tuple[str, ...], target: tuple[str, ...]) -> dict[str, list[str]]:
    found = {m: sorted(d for d in deps if _in(d, *target)) for m, deps in _graphs()[0].items() if _in(m, *source)}
    return {m: deps for m, deps in found.items() if deps}


def test_stream_apps_top_imports_no_tier() -> None:
    """The modules left at stream_app's top (settings, guard, ports, day_figure) sit below every
    tier: none of them imports a tier's module."""
    top = tuple(m for m in MODULES if m.count(".") == 1 and m.startswith("stream_app.") and not _in(m, *TIERS))
    assert "stream_app.guard" in top and "stream_app.worker" not in top
    assert _edges(top, TIERS) == {}


def test_the_worker_imports_no_other_tier() -> None:
    """The worker reads what lies below it, never the shuffler, the outputs or the command line."""
    assert _edges((WORKER,), (SHUFFLER, *OUTPUTS, COMPOSITION_ROOT)) == {}


def test_the_shuffler_imports_nothing_of_the_worker() -> None:
    """The shuffler comes before the worker on a report's path: it writes its dead letters with
    the wire's ``Rejected`` (schemas/estimates.py, as the worker's stage 1 does) and imports
    nothing of the worker or of the outputs."""
    assert _edges((SHUFFLER,), (WORKER, *OUTPUTS)) == {}


def test_the_outputs_read_of_the_worker_only_its_frames() -> None:
    """``ptt subscribe`` and ``ptt report`` decode the worker's estimate frames (stream_app/worker/frames.py)
    and import nothing else of the worker, nor the shuffler."""
    assert {d for deps in _edges(OUTPUTS, (WORKER, SHUFFLER)).values() for d in deps} == {"stream_app.worker.frames"}
