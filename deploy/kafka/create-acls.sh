#!/usr/bin/env bash
# One-shot (the `kafka-acls` service of docker-compose.yml): the ACLs of every principal. The
# broker runs the StandardAuthorizer with allow.everyone.if.no.acl.found=false, so what is not
# granted here is denied; only the admin principal (super.users) bypasses it. Runs as admin
# (PTT_* client settings, see client-properties.sh). Idempotent: kafka-acls --add of an ACL that
# exists changes nothing. It only adds: an ACL removed from this table must be removed by hand
# (kafka-acls.sh --remove, see deploy/README.md).
#
# READ and WRITE imply DESCRIBE on the same resource (Kafka's rule), so DESCRIBE is listed
# only where it is the sole grant (WRITE on a transactional id implies its DESCRIBE too). No
# IdempotentWrite on the cluster: since Kafka 3.0 (KIP-679) an idempotent or transactional
# producer needs only WRITE on a topic or its transactional id. Names are the defaults of
# KafkaSettings / WorkerSettings / ShufflerSettings (PTT_APP_ID=ptt-stream, PTT_SHUFFLER_ID=ptt-shuffler); tests/unit/project/test_deploy.py runs this script against a fake
# kafka-acls.sh and compares the grants with what each principal's code uses.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=client-properties.sh
. "$here/client-properties.sh"

BOOTSTRAP="${BOOTSTRAP:-kafka:9094}"
KAFKA_ACLS="${KAFKA_ACLS:-/opt/kafka/bin/kafka-acls.sh}"

# principal   operations          resource  name               pattern   why
ACLS='
device        Write               topic     ptt.reports        literal   # report batches and end-of-epoch markers
device        Write               topic     ptt.device-reports literal   # single reports to the shuffler (all it needs then)
replay        Write               topic     ptt.reports        literal   # the simulated fleet: a device gateway
replay        Write               topic     ptt.truth          literal   # ground truth (evaluation only)
replay        Read                topic     ptt.queries        literal   # which queries the devices answer
replay        Write               topic     ptt.device-reports-source literal # --via-shuffler: per-epoch source notes: the shuffler clock
worker        Read                topic     ptt.reports        literal
worker        Read                topic     ptt.queries        literal
worker        Read                topic     ptt.truth          literal
worker        Write               topic     ptt.estimates      literal
worker        Write               topic     ptt.estimate-frames literal  # PTT_ESTIMATE_OUTPUT=both
worker        Write               topic     ptt.dead-letter    literal
worker        Read,Write,Create   topic     ptt-stream-        prefixed  # its own: partials, changelog, assignor
worker        Read                group     ptt-stream         prefixed  # its consumer group (PTT_APP_ID)
shuffler      Read                topic     ptt.device-reports literal   # its input: single device reports
shuffler      Read                topic     ptt.device-reports-source literal # its trusted clock: the source notes of the replay
shuffler      Read                topic     ptt.queries        literal   # which queries the reports answer
shuffler      Write               topic     ptt.reports        literal   # permuted batches and end-of-epoch markers
shuffler      Write               topic     ptt.dead-letter    literal
shuffler      Read,Write          topic     ptt-shuffler-state- prefixed # its state log, one per instance
shuffler      Read                group     ptt-shuffler-      prefixed  # its consumer group (<shuffler_id>-<index>)
shuffler      Write               transactional-id ptt-shuffler- prefixed # its transactional id (<shuffler_id>-<index>)
analyst       Read,Write          topic     ptt.queries        literal   # publish, and read versions back
analyst       Read                topic     ptt.estimates      literal
analyst       Read                topic     ptt.estimate-frames literal
analyst       Describe            topic     ptt.reports        literal   # metadata only: ptt analyst checks
analyst       Describe            topic     ptt.truth          literal   #   that the pipeline topics exist
subscriber    Read                topic     ptt.estimates      literal
subscriber    Read                topic     ptt.estimate-frames literal  # ptt subscribe --arrow/--parquet
subscriber    Read                topic     ptt.queries        literal   # the ptt subscribe table: how many estimates an epoch has
'

# The shuffler's HTTP front door (the compose file's SHUFFLER_HTTP_PORT, the shuffler's
# PTT_HTTP_PORT; 0: no door) writes the reports it has verified to the device topic itself.
if [ "${SHUFFLER_HTTP_PORT:-0}" != 0 ]; then
  ACLS+='shuffler      Write               topic     ptt.device-reports literal   # its front door: verified device reports
'
fi

props="$(mktemp)"
trap 'rm -f "$props"' EXIT
write_client_properties "$props"

while read -r principal operations resource name pattern _; do
  [ -n "$principal" ] || continue
  args=(--bootstrap-server "$BOOTSTRAP" --command-config "$props" --add
        --allow-principal "User:$principal" "--$resource" "$name" --resource-pattern-type "$pattern")
  IFS=, read -ra ops <<< "$operations"
  for op in "${ops[@]}"; do args+=(--operation "$op"); done
  "$KAFKA_ACLS" "${args[@]}" > /dev/null
  echo "create-acls: User:$principal $operations $resource $name ($pattern)"
done <<< "$ACLS"
