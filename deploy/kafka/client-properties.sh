#!/usr/bin/env bash
# Sourced by the one-shot jobs (create-users.sh, create-acls.sh, create-topics.sh) and the
# broker's healthcheck: writes the --command-config file of Kafka's CLI tools from the same
# PTT_* variables the project's own clients read (schemas/settings.py KafkaSettings):
#
#   PTT_SECURITY_PROTOCOL   PLAINTEXT | SASL_PLAINTEXT | SASL_SSL | SSL
#   PTT_SASL_MECHANISM      PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
#   PTT_SASL_PLAIN_USERNAME, PTT_SASL_PLAIN_PASSWORD
#   PTT_SSL_CAFILE          (SSL, SASL_SSL) a PEM bundle to trust
#
# usage: . client-properties.sh; write_client_properties FILE
# The file holds a password: it is created mode 600 and the callers delete it on exit.

# check_credential NAME: the variable NAME is set and safe inside a JAAS string and a
# kafka-configs value (no quotes, backslashes, commas, brackets, '=' or whitespace)
check_credential() {
  local name=$1 value=${!1:-}
  if [ -z "$value" ]; then
    echo "${0##*/}: $name is not set" >&2
    return 1
  fi
  local bad='[]["\\'"'"',=[:space:]]'
  if [[ "$value" =~ $bad ]]; then
    echo "${0##*/}: $name contains a character that is not allowed (quote, backslash, comma, '=', bracket, space)" >&2
    return 1
  fi
}

write_client_properties() {
  local file=$1 protocol=${PTT_SECURITY_PROTOCOL:-PLAINTEXT} mechanism=${PTT_SASL_MECHANISM:-} module
  (umask 077 && : > "$file")
  echo "security.protocol=$protocol" >> "$file"
  case "$protocol" in
    PLAINTEXT) return 0 ;;
    SSL|SASL_SSL)
      if [ -n "${PTT_SSL_CAFILE:-}" ]; then
        printf 'ssl.truststore.type=PEM\nssl.truststore.location=%s\n' "$PTT_SSL_CAFILE" >> "$file"
      fi ;;
    SASL_PLAINTEXT) ;;
    *) echo "${0##*/}: unknown PTT_SECURITY_PROTOCOL '$protocol'" >&2; return 1 ;;
  esac
  [ "$protocol" = SSL ] && return 0
  case "$mechanism" in
    PLAIN) module=org.apache.kafka.common.security.plain.PlainLoginModule ;;
    SCRAM-SHA-256|SCRAM-SHA-512) module=org.apache.kafka.common.security.scram.ScramLoginModule ;;
    *) echo "${0##*/}: PTT_SASL_MECHANISM must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (got '$mechanism')" >&2
       return 1 ;;
  esac
  check_credential PTT_SASL_PLAIN_USERNAME || return 1
  check_credential PTT_SASL_PLAIN_PASSWORD || return 1
  printf 'sasl.mechanism=%s\nsasl.jaas.config=%s required username="%s" password="%s";\n' \
    "$mechanism" "$module" "$PTT_SASL_PLAIN_USERNAME" "$PTT_SASL_PLAIN_PASSWORD" >> "$file"
}
