"""Every docstring example in the packages runs and holds (river's habit: statistics with
examples). A module without examples passes trivially."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("estimators", "schemas", "producers", "stream_app")


def _modules() -> list[str]:
    out = []
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        out.append(pkg)
        out += [f"{pkg}.{m.name}" for m in pkgutil.iter_modules(mod.__path__)]
    return out


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_the_examples_exist() -> None:
    """The registry, the stage records, the windows and the privacy accounting carry examples."""
    attempted = {name: doctest.testmod(importlib.import_module(name)).attempted for name in
                 ("estimators.registry", "stream_app.records", "stream_app.windows", "estimators.privacy",
                  "estimators.linear", "schemas.epochs")}
    assert all(n > 0 for n in attempted.values()), attempted
