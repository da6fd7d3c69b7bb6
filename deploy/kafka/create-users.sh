#!/usr/bin/env bash
# One-shot (the `kafka-users` service of docker-compose.yml): the SCRAM-SHA-512 credentials of
# every principal, then the client quotas. Runs as the admin principal (PTT_* client settings,
# see client-properties.sh) against the broker's admin listener. Idempotent: re-running sets
# the passwords again (a new salt), so it is also how a password is rotated (deploy/README.md).
#
# Passwords: one environment variable per principal (below), from deploy/.env (.env.example).
# tests/unit/project/test_deploy.py runs this script against a fake kafka-configs.sh and checks that
# every service's credentials match a user created here and that the quotas are set.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=client-properties.sh
. "$here/client-properties.sh"

BOOTSTRAP="${BOOTSTRAP:-kafka:9094}"
KAFKA_CONFIGS="${KAFKA_CONFIGS:-/opt/kafka/bin/kafka-configs.sh}"
SCRAM_ITERATIONS="${SCRAM_ITERATIONS:-8192}"

# principal    its password variable
USERS='
device         DEVICE_PASSWORD
replay         REPLAY_PASSWORD
worker         WORKER_PASSWORD
shuffler       SHUFFLER_PASSWORD
analyst        ANALYST_PASSWORD
subscriber     SUBSCRIBER_PASSWORD
'

# principal    quotas (kafka-configs --entity-type users); bytes/s per broker, request_percentage =
# % of one network+I/O thread. The device cap is per principal: all devices sharing the
# `device` principal share it. The replay is the whole simulated fleet (a gateway).
QUOTAS="
device         producer_byte_rate=${DEVICE_PRODUCER_BYTE_RATE:-1048576},request_percentage=${DEVICE_REQUEST_PERCENTAGE:-25}
replay         producer_byte_rate=${REPLAY_PRODUCER_BYTE_RATE:-52428800}
analyst        producer_byte_rate=${ANALYST_PRODUCER_BYTE_RATE:-65536},consumer_byte_rate=${ANALYST_CONSUMER_BYTE_RATE:-10485760}
subscriber     consumer_byte_rate=${SUBSCRIBER_CONSUMER_BYTE_RATE:-10485760}
"

props="$(mktemp)"
trap 'rm -f "$props"' EXIT
write_client_properties "$props"

# every password first: nothing is created unless all are usable
while read -r user var; do
  [ -n "$user" ] || continue
  check_credential "$var"
done <<< "$USERS"

while read -r user var; do
  [ -n "$user" ] || continue
  "$KAFKA_CONFIGS" --bootstrap-server "$BOOTSTRAP" --command-config "$props" --alter \
    --add-config "SCRAM-SHA-512=[iterations=$SCRAM_ITERATIONS,password=${!var}]" \
    --entity-type users --entity-name "$user" > /dev/null
  echo "create-users: $user (SCRAM-SHA-512)"
done <<< "$USERS"

while read -r user quota; do
  [ -n "$user" ] || continue
  "$KAFKA_CONFIGS" --bootstrap-server "$BOOTSTRAP" --command-config "$props" --alter \
    --add-config "$quota" --entity-type users --entity-name "$user" > /dev/null
  echo "create-users: $user quota $quota"
done <<< "$QUOTAS"
