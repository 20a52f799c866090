#!/usr/bin/env bash
# manual profile of a 3-member ephd under etcd's benchmark put; loopback, my own ports
set -u
E=/work/tgt/bench/release/ephd
B=~/.cache/etcd-benchmark/bin/benchmark
P=(42121 42122 42123 42221 42222 42223)
IC="m0=http://127.0.0.1:42221,m1=http://127.0.0.1:42222,m2=http://127.0.0.1:42223"
EPS=127.0.0.1:42121,127.0.0.1:42122,127.0.0.1:42123
pids=(); TOK=tp$RANDOM
for i in 0 1 2; do $E --name m$i --listen-client-urls http://127.0.0.1:${P[$i]} --advertise-client-urls http://127.0.0.1:${P[$i]} --listen-peer-urls http://127.0.0.1:${P[$((i+3))]} --initial-advertise-peer-urls http://127.0.0.1:${P[$((i+3))]} --initial-cluster $IC --initial-cluster-token $TOK --initial-cluster-state new --quota-backend-bytes 8589934592 --log-level warn > /tmp/prof/m$i.log 2>&1 & pids+=($!); done
for k in $(seq 50); do python3 /work/wt/bench/bench/cluster_tool.py whole $EPS 2>/dev/null && break; sleep 0.3; done
read li lid < <(python3 /work/wt/bench/bench/cluster_tool.py leader $EPS)
L=${pids[$li]}; F=${pids[$(( (li+1)%3 ))]}
echo "leader pid $L follower pid $F"
ctx() { cat /proc/$1/task/*/status | awk '/ctxt_switches/{s+=$2} END{print s}'; }
c0=$(ctx $L); f0=$(ctx $F)
timeout 120 $B --endpoints $EPS --dial-timeout 5s --clients 100 --conns 10 put --total ${TOTAL:-100000} --key-size 48 --val-size 1024 --key-space-size 100000 ${RATE:+--rate $RATE} > /tmp/prof/bench.txt 2>/dev/null &
BP=$!
sleep 3
perf record -F 499 --call-graph dwarf,32768 -p $L -o /tmp/prof/leader${RATE:+-rate}.data -- sleep 4 2>/dev/null &
perf record -F 499 --call-graph dwarf,32768 -p $F -o /tmp/prof/follower${RATE:+-rate}.data -- sleep 4 2>/dev/null
wait $BP
echo "ctx switches leader $(( $(ctx $L) - c0 )) follower $(( $(ctx $F) - f0 ))"
grep -E "Requests/sec|99% in" /tmp/prof/bench.txt
for p in ${pids[@]}; do kill $p; done; wait 2>/dev/null
