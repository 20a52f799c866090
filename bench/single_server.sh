# Sourced by bench/floor.sh and bench/curve.sh: starts and stops one server
# at a time on $ENDPOINT (host:port), its output in $OUT/server.log.
# Servers: ephd ($EPHD, defaults), etcd-3.6 ($ETCD, data dir under $DATA on
# tmpfs, peer port $PEER_PORT) and floor ($FLOOR, grpc-floor). ephd and etcd
# both get the same space quota, SPACE_QUOTA_BYTES (default 8 GiB, etcd's
# largest recommended): the large sizes of the cost curve measure cost, and
# at the 2 GiB default the million-object runs end in NOSPACE.
# A server is ready once it acknowledges a put (under /bench-ready/, away
# from the prefixes the workloads write); one that does not within 10 s
# fails the start with its log's last lines.

SERVER_PID=""
SPACE_QUOTA_BYTES=${SPACE_QUOTA_BYTES:-8589934592}

start_server() { # server
  case $1 in
    ephd)
      "$EPHD" --listen-client-urls "http://$ENDPOINT" --quota-backend-bytes "$SPACE_QUOTA_BYTES" \
        --log-level warn >"$OUT/server.log" 2>&1 &
      ;;
    etcd-3.6)
      rm -rf "$DATA/etcd"
      "$ETCD" --name bench --data-dir "$DATA/etcd" \
        --listen-client-urls "http://$ENDPOINT" --advertise-client-urls "http://$ENDPOINT" \
        --listen-peer-urls "http://127.0.0.1:$PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
        --initial-cluster "bench=http://127.0.0.1:$PEER_PORT" \
        --quota-backend-bytes "$SPACE_QUOTA_BYTES" \
        --logger zap --log-outputs stderr --log-level warn >"$OUT/server.log" 2>&1 &
      ;;
    floor)
      "$FLOOR" "$ENDPOINT" >"$OUT/server.log" 2>&1 &
      ;;
    *)
      echo "unknown server $1 (ephd, etcd-3.6 or floor)" >&2
      return 1
      ;;
  esac
  SERVER_PID=$!
  local i
  for ((i = 0; i < 100; i++)); do
    if "$BENCH" put --endpoints "$ENDPOINT" --total 1 --clients 1 --conns 1 \
      --prefix /bench-ready/ --no-progress >/dev/null 2>&1; then
      return 0
    fi
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "$1 did not come up:" >&2
  tail -5 "$OUT/server.log" >&2 || true
  return 1
}

# SIGTERM, then SIGKILL after 30 s; removes etcd's data dir.
stop_server() {
  [[ -n $SERVER_PID ]] || return 0
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  local i
  for ((i = 0; i < 300; i++)); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
  rm -rf "$DATA/etcd"
}
