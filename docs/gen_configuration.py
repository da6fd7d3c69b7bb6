"""Regenerate the table in docs/configuration.md from the settings classes:
``python docs/gen_configuration.py > docs/configuration.md`` (tests/unit/stream_app/cli/test_base.py
checks the file is current)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic.fields import FieldInfo  # noqa: E402
from pydantic_settings import BaseSettings  # noqa: E402

from producers.settings import ReplaySettings  # noqa: E402
from schemas.settings import BrokerLossSettings, EnrollmentSettings, KafkaSettings, cache_dir  # noqa: E402
from stream_app.cli.demo_settings import DemoSettings  # noqa: E402
from stream_app.settings import WorkerSettings  # noqa: E402
from stream_app.shuffler.settings import ShufflerSettings  # noqa: E402

HEAD = """# Configuration reference

Every setting is an environment variable and a flag; flags win. Lists in the environment are
JSON (`PTT_DEVICE_BLACKLIST='[400001, 400002]'`), on the command line comma-separated. Broker
and security settings apply to every command that talks to Kafka (`replay`, `worker`,
`shuffler`, `analyst`, `subscribe`, `report`). `ptt demo` starts its own broker, so it takes none of them.
Generated from the settings classes by `docs/gen_configuration.py` (a test checks it is current).

| variable | flag | default | commands | meaning |
| --- | --- | --- | --- | --- |
"""


def shown_default(info: FieldInfo) -> str:
    """A setting's default as the table shows it; the user's cache directory
    (:func:`schemas.settings.cache_dir`, a default factory) as the rule, not this machine's path."""
    factory = info.default_factory
    if factory is not None:
        if getattr(factory, "func", factory) is not cache_dir:
            raise ValueError(f"no table entry for the default factory {factory!r}")
        where = "/".join(("ptt", *getattr(factory, "args", ())))
        return f"`$XDG_CACHE_HOME/{where}` (else `~/.cache/{where}`)"
    default = info.default
    return "—" if default is None else f"`{list(default) if isinstance(default, tuple) else default}`"


def rows() -> list[str]:
    out: list[str] = []
    groups: list[tuple[type[BaseSettings], str, set[str]]] = [
        (KafkaSettings, "all", set()),
        (BrokerLossSettings, "replay, worker, shuffler", set(KafkaSettings.model_fields)),
        (EnrollmentSettings, "replay, shuffler", set(BrokerLossSettings.model_fields)),
        (ReplaySettings, "replay", set(EnrollmentSettings.model_fields)),
        (WorkerSettings, "worker", set(BrokerLossSettings.model_fields)),
        (ShufflerSettings, "shuffler", set(EnrollmentSettings.model_fields)),
        (DemoSettings, "demo", set()),
    ]
    for model, commands, skip in groups:
        prefix = str(model.model_config.get("env_prefix", ""))
        for name, info in model.model_fields.items():
            if name in skip:
                continue
            shown = shown_default(info)
            meaning = info.description or name.replace("_", " ")
            out.append(f"| `{prefix}{name.upper()}` | `--{name.replace('_', '-')}` | {shown} | {commands} | "
                       f"{meaning} |")
    return out


def render() -> str:
    return HEAD + "\n".join(rows()) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
