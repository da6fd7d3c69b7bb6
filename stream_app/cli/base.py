"""What the commands share: the parser class, argument types used by several commands, how
to call ``ptt``, and flags generated from a pydantic-settings class: every ``PTT_X``
environment variable has a ``--x`` flag, flags default to "not given", and given flags win."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import types
import typing
from datetime import date
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from pydantic import SecretStr
from pydantic_settings import BaseSettings

from .errors import EXIT_USAGE

__all__ = ["Parser", "add_settings_flags", "param", "ptt_command", "settings_from_args"]

S = TypeVar("S", bound=BaseSettings)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong; how to get help), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def param(text: str) -> tuple[str, float]:
    """A ``NAME=VALUE`` mechanism parameter (``--param``)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name.strip(), float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{name}: {value!r} is not a number") from exc


def ptt_command() -> str:
    """How to run ``ptt`` from the current directory, as the user can type it."""
    exe = Path(sys.executable).parent / "ptt"
    found = shutil.which("ptt")
    if found and exe.exists() and Path(found).resolve() == exe.resolve():
        return "ptt"
    if exe.exists():
        rel = os.path.relpath(exe)
        return rel if not rel.startswith("..") else str(exe)
    return f"{sys.executable} -m stream_app.cli"


def _base(annotation: Any) -> tuple[Any, bool]:
    """Strip ``X | None``; return (type, optional)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _int_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def _str_map(text: str) -> dict[str, str]:
    """``name=value,name=value`` (a dict setting on the command line; JSON in the environment)."""
    out: dict[str, str] = {}
    for item in (x.strip() for x in text.split(",")):
        if item:
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise argparse.ArgumentTypeError(f"expected name=value[,name=value...], got {text!r}")
            out[name.strip()] = value.strip()
    return out


def add_settings_flags(parser: argparse.ArgumentParser, model: type[BaseSettings],
                       skip: frozenset[str] = frozenset()) -> None:
    prefix = str(model.model_config.get("env_prefix", ""))
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        kind, _ = _base(info.annotation)
        env = f"{prefix}{name}".upper()
        default = info.get_default(call_default_factory=True)  # a factory's: this user's (schemas.settings.cache_dir)
        helptext = f"{info.description or name} (env {env}; default {default!r})"
        kw: dict[str, Any] = {"default": None, "dest": name, "help": helptext.replace("%", "%%")}
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
            continue
        if typing.get_origin(kind) is typing.Literal:
            kw["choices"] = list(typing.get_args(kind))
        elif kind in (int, float, str):
            kw["type"] = kind
        elif kind is Path:
            kw["type"] = Path
        elif kind is date:
            kw["type"] = date.fromisoformat
        elif kind is SecretStr:
            kw["type"] = str
        elif typing.get_origin(kind) is tuple:
            kw["type"] = _int_tuple
        elif typing.get_origin(kind) is dict:
            kw["type"] = _str_map
        parser.add_argument(flag, **kw)


def settings_from_args(model: type[S], args: argparse.Namespace) -> S:
    given = {name: getattr(args, name) for name in model.model_fields
             if getattr(args, name, None) is not None}
    return model(**given)
