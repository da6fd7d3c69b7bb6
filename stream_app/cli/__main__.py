"""``python -m stream_app.cli``: the same as the ``ptt`` console script."""

from __future__ import annotations

from . import main

raise SystemExit(main())
