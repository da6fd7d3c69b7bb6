#!/usr/bin/env bash
# One-shot: create every topic of the pipeline with explicit partition counts, then check them.
#
# Run by the `topics` service of docker-compose.yml (image apache/kafka) before any worker or
# replay starts. Idempotent (--if-not-exists). Fails (exit 1) if a topic already exists with
# another partition count: Faust refuses such topics, and a re-keyed stage with the wrong
# count would silently split epochs. The names and counts are the defaults of WorkerSettings /
# ReplaySettings / ShufflerSettings (PTT_PARTITIONS=4, PTT_INTERNAL_PARTITIONS=4, PTT_APP_ID=ptt-stream,
# PTT_DEVICE_PARTITIONS=4; one shuffler instance, PTT_SHUFFLER_ID=ptt-shuffler: its state topic
# ptt-shuffler-state-0; another instance N needs ptt-shuffler-state-N added here);
# tests/unit/project/test_deploy.py runs this script against a fake kafka-topics.sh and compares.
# Runs as the admin principal (PTT_* client settings, see client-properties.sh): topic creation
# is granted to no other principal.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=client-properties.sh
. "$here/client-properties.sh"

BOOTSTRAP="${BOOTSTRAP:-kafka:9094}"
KAFKA_TOPICS="${KAFKA_TOPICS:-/opt/kafka/bin/kafka-topics.sh}"
props="$(mktemp)"
trap 'rm -f "$props"' EXIT
write_client_properties "$props"

# topic                             partitions  config
TOPICS='
ptt.reports                         4
ptt.queries                         1           cleanup.policy=compact
ptt.truth                           1
ptt.estimates                       4
ptt.estimate-frames                 4
ptt.dead-letter                     1
ptt.device-reports                  4
ptt.device-reports-source           1
ptt-shuffler-state-0                1           cleanup.policy=compact
ptt-stream-partials                 4
ptt-stream-windows-changelog        4           cleanup.policy=compact
ptt-stream-__assignor-__leader      1
'

while read -r topic partitions config; do
  [ -n "$topic" ] || continue
  args=(--bootstrap-server "$BOOTSTRAP" --command-config "$props" --create --if-not-exists --topic "$topic"
        --partitions "$partitions" --replication-factor 1)
  if [ -n "${config:-}" ]; then args+=(--config "$config"); fi
  "$KAFKA_TOPICS" "${args[@]}"
done <<< "$TOPICS"

described="$("$KAFKA_TOPICS" --bootstrap-server "$BOOTSTRAP" --command-config "$props" --describe)"
status=0
while read -r topic partitions config; do
  [ -n "$topic" ] || continue
  got="$(awk -v t="$topic" '$1 == "Topic:" && $2 == t {
           for (i = 3; i < NF; i++) if ($i == "PartitionCount:") print $(i + 1) }' <<< "$described")"
  if [ "$got" != "$partitions" ]; then
    echo "create-topics: $topic has ${got:-no} partitions, expected $partitions" >&2
    status=1
  else
    echo "create-topics: $topic ok ($partitions partitions${config:+, $config})"
  fi
done <<< "$TOPICS"
exit "$status"
