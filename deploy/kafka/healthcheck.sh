#!/usr/bin/env bash
# The kafka service's healthcheck: the broker answers an authenticated request on its admin
# listener (kafka:9094, SASL/PLAIN as the admin principal; ADMIN_PASSWORD from the environment).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=client-properties.sh
. "$here/client-properties.sh"
props="$(mktemp)"
trap 'rm -f "$props"' EXIT
PTT_SECURITY_PROTOCOL=SASL_PLAINTEXT PTT_SASL_MECHANISM=PLAIN PTT_SASL_PLAIN_USERNAME=admin \
  PTT_SASL_PLAIN_PASSWORD="${ADMIN_PASSWORD:-}" write_client_properties "$props"
/opt/kafka/bin/kafka-broker-api-versions.sh --bootstrap-server "${BOOTSTRAP:-kafka:9094}" \
  --command-config "$props" > /dev/null
