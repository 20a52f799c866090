#!/bin/bash
# ephd-healthcheck: the container image's HEALTHCHECK.
#
# GETs ephd's etcd-compatible health endpoint on the metrics listener and
# succeeds iff the answer is HTTP 200 with {"health":"true"} in the body.
# Uses bash builtins only (/dev/tcp, read, printf): the runtime image needs
# no curl or wget, and the check forks no child processes.
#
# Where to connect, first match wins:
#   EPHD_HEALTHCHECK_ADDR   host:port (IPv4 or a name; not a bracketed IPv6)
#   EPHD_LISTEN_METRICS_URLS first URL of it (the image sets
#                            http://0.0.0.0:2381); a wildcard host becomes
#                            127.0.0.1
#   127.0.0.1:2381
# EPHD_HEALTHCHECK_PATH overrides the path (default /health?exclude=NOSPACE:
# a full store stays healthy, so that it is compacted and disarmed rather
# than restarted).
# Plain http only: with https metrics URLs use an orchestrator probe instead.
set -u

addr="${EPHD_HEALTHCHECK_ADDR:-}"
if [ -z "$addr" ]; then
  url="${EPHD_LISTEN_METRICS_URLS:-http://127.0.0.1:2381}"
  url="${url%%,*}"
  case "$url" in
    http://*) ;;
    *) echo "ephd-healthcheck: unsupported metrics URL ${url}" >&2; exit 1 ;;
  esac
  addr="${url#http://}"
  addr="${addr%%/*}"
fi
path="${EPHD_HEALTHCHECK_PATH:-/health?exclude=NOSPACE}"
host="${addr%:*}"
port="${addr##*:}"
case "$host" in
  "" | 0.0.0.0 | "[::]" | "::") host=127.0.0.1 ;;
esac

if ! exec 3<>"/dev/tcp/${host}/${port}"; then
  echo "ephd-healthcheck: cannot connect to ${host}:${port}" >&2
  exit 1
fi
# HTTP/1.0: the server closes the connection after the answer and does not
# use chunked encoding, so the body can be read up to EOF as-is.
printf 'GET %s HTTP/1.0\r\nHost: %s:%s\r\nAccept: application/json\r\n\r\n' \
  "$path" "$host" "$port" >&3

IFS= read -r -t 2 status <&3 || { echo "ephd-healthcheck: no answer" >&2; exit 1; }
status="${status%$'\r'}"
case "$status" in
  "HTTP/1."[01]" 200"*) ;;
  *) echo "ephd-healthcheck: ${status}" >&2; exit 1 ;;
esac

# Skip the headers (up to the empty line), keep the body; bounded reads.
body=""
in_body=0
lines=0
while [ "$lines" -lt 256 ]; do
  line=""
  IFS= read -r -t 2 line <&3
  rc=$?
  line="${line%$'\r'}"
  if [ "$in_body" = 1 ]; then
    body+="$line"
  elif [ -z "$line" ]; then
    in_body=1
  fi
  [ "$rc" = 0 ] || break
  lines=$((lines + 1))
done
exec 3<&-

if [[ "$body" =~ \"health\"[[:space:]]*:[[:space:]]*\"true\" ]]; then
  exit 0
fi
echo "ephd-healthcheck: unhealthy: ${body:0:200}" >&2
exit 1
