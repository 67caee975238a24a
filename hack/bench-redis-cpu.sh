#!/usr/bin/env bash
# Measures where the CPU goes in one BenchmarkProxy variant: the cores the test process
# (load generator, proxy and backend) and its redis-server use, read from /proc over
# two seconds in the middle of the run, and the CPU microseconds per request of each.
#
# Usage: hack/bench-redis-cpu.sh [VARIANT]   (default tokenwarden-redis; also
#        tokenwarden-memory, tokenwarden-redis-typical, bare-reverseproxy)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
variant=${1:-tokenwarden-redis}
bin=$(mktemp)
out=$(mktemp)
trap 'rm -f "$bin" "$out"' EXIT
go test -c -o "$bin" ./proxy/server/ >/dev/null
"$bin" -test.run '^$' -test.bench "^BenchmarkProxy/$variant\$" -test.benchtime 4s >"$out" 2>&1 &
pid=$!
sleep 2
ticks() { [ -n "$1" ] && awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
redis=$(pgrep -P "$pid" redis-server || true)
hz=$(getconf CLK_TCK)
t0=$(date +%s.%N); g0=$(ticks "$pid"); r0=$(ticks "$redis")
sleep 2
t1=$(date +%s.%N); g1=$(ticks "$pid"); r1=$(ticks "$redis")
wait "$pid"
line=$(grep "^BenchmarkProxy/$variant" "$out")
echo "$line"
awk -v g=$((g1 - g0)) -v r=$((r1 - r0)) -v hz="$hz" -v t0="$t0" -v t1="$t1" -v ns="$(echo "$line" | awk '{print $3}')" 'BEGIN {
	gc = g / hz / (t1 - t0); rc = r / hz / (t1 - t0)
	printf "test process %.2f cores, %.0f µs CPU per request\n", gc, gc * ns / 1000
	printf "redis-server %.2f cores, %.0f µs CPU per request\n", rc, rc * ns / 1000
}'
