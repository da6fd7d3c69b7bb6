"""One-shot (the `queries` service of docker-compose.yml): publish the demo's queries (alp-day
and unary-day over every station of the replayed day, or PTT_QUERY_MECHANISMS's) as the **analyst** principal, if the
queries topic has none.

``ptt replay`` would publish them itself (``PTT_DEFAULT_QUERIES=true``), but in the secured
deployment the replay runs as the ``replay`` principal, a device gateway, which may not write the
queries topic. This job reads the same ``PTT_*`` day settings as the replay (so the queries cover
the same stations, population and time span) and publishes with the analyst's credentials.
"""

from __future__ import annotations

import sys

from producers.replay import default_queries, fleet_size_for, load_day
from producers.settings import ReplaySettings
from schemas.kafka_io import BrokerUnavailable, publish_query, read_queries


def main() -> int:
    settings = ReplaySettings()
    try:
        existing = read_queries(settings)
        if existing:
            print(f"publish-demo-queries: {len(existing)} query versions exist; nothing published")
            return 0
        day = load_day(settings)
        for query in default_queries(day, fleet_size_for(day, settings), settings.mechanisms):
            publish_query(settings, query)
            print(f"publish-demo-queries: published {query.record_key} as {settings.sasl_plain_username}")
    except BrokerUnavailable as exc:
        print(f"publish-demo-queries: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
